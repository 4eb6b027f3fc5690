"""The Gluon NVFP4 kernel's layout and decoding (quantbench/moe/nvfp4_wgmma.py) without a GPU: `repack` and
`unpack` are inverses and keep every code; the decode PTX, run by a small interpreter on the words a lane loads
from a repacked row (as the kernel stages it: 16 contiguous words per 128-column block, lane c at positions 2c,
2c+1, 2c+8, 2c+9), must give exactly value · block scale · 2^-8 (bf16; 2^-7 fp16) for the columns of each
16-column slice it feeds the MMA, E2M1's 0.5 (a 16-bit subnormal before the multiply) and E4M3's subnormal
scales included; and pick_config must hand the kernel only to a device that has it.

The kernel itself runs only on sm_90 (benchmarks/nvfp4_wgmma_gpu.py checks it there against the Triton kernel
and a float64 reference, including a multiply of subnormals on the hardware; tests/test_compile_sm90.py compiles
it here)."""

from __future__ import annotations

import pytest
import torch

from quantbench.engine.moe import nvfp4, nvfp4_numbers, nvfp4_wgmma

MASK = 0xFFFFFFFF


def _half(bits: int, fp16: bool) -> float:
    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16 if fp16 else torch.bfloat16).item()


def _bits(v: float, fp16: bool) -> int:
    t = torch.tensor([v], dtype=torch.float64).to(torch.float16 if fp16 else torch.bfloat16)
    return int(t.view(torch.int16).item()) & 0xFFFF


def run_asm(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """The PTX the decode uses: and, shf.r.wrap, mul.lo, shl, lop3 (any table), mul.rn.{bf16,f16}x2."""
    body = asm.strip().removeprefix("{").removesuffix("}")
    r = dict(regs)

    def val(tok: str) -> int:
        return r[tok] if tok in r else int(tok, 0) & MASK

    for ins in filter(None, (i.strip() for i in body.split(";"))):
        op, _, rest = ins.partition(" ")
        a = [x.strip() for x in rest.split(",")]
        if op == ".reg":
            continue
        if op == "and.b32":
            v = val(a[1]) & val(a[2])
        elif op == "shf.r.wrap.b32":
            assert a[1] == a[2], ins  # a rotation
            n = int(a[3]) % 32
            v = ((val(a[1]) >> n) | (val(a[1]) << (32 - n))) & MASK
        elif op == "mul.lo.u32":
            v = (val(a[1]) * val(a[2])) & MASK
        elif op == "shl.b32":
            v = (val(a[1]) << int(a[2])) & MASK
        elif op == "lop3.b32":
            x, y, z, lut = val(a[1]), val(a[2]), val(a[3]), int(a[4], 0)
            v = 0
            for i in range(8):  # lut bit i: the output for (x, y, z) = (i >> 2, i >> 1, i) & 1
                if lut >> i & 1:
                    v |= (x if i & 4 else ~x) & (y if i & 2 else ~y) & (z if i & 1 else ~z)
            v &= MASK
        elif op in ("mul.rn.bf16x2", "mul.rn.f16x2"):
            fp16 = op == "mul.rn.f16x2"
            x, y = val(a[1]), val(a[2])
            h = [_bits(_half((x >> s) & 0xFFFF, fp16) * _half((y >> s) & 0xFFFF, fp16), fp16) for s in (0, 16)]
            v = h[0] | h[1] << 16
        else:
            raise AssertionError(f"instruction the interpreter does not know: {ins}")
        r[a[0]] = v
    return r


def test_repack_and_unpack_are_inverses_and_keep_every_code():
    torch.manual_seed(0)
    packed = torch.randint(0, 256, (3, 5, 128), dtype=torch.uint8)  # K = 256: two 128-column blocks
    words = nvfp4_wgmma.repack(packed)
    assert words.shape == packed.shape and words.dtype == torch.uint8
    assert not torch.equal(words, packed)
    assert torch.equal(nvfp4_wgmma.unpack(words), packed)
    # every bit of a word belongs to exactly one code bit: the layout is a permutation
    column, code_bit, word_bit = nvfp4_wgmma._layout()
    assert sorted(set(zip(column.flatten().tolist(), code_bit.flatten().tolist(), strict=True))) == [
        (k, b) for k in range(128) for b in range(4)]
    assert all(sorted(row.tolist()) == list(range(32)) for row in word_bit)


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("scale", [2.0**-9, 2.0**-7 * 1.625, 1.25, 448.0])  # E4M3: subnormal, small, 1.25, max
def test_each_lane_decodes_exactly_the_codes_of_its_slice(fp16, scale):
    torch.manual_seed(int(scale * 1000))
    row = torch.randint(0, 256, (64,), dtype=torch.uint8)  # one row's 128-column block, as ModelOpt packs it
    row[:4] = nvfp4_numbers.pack_codes(torch.tensor([1, 9, 0, 8, 7, 15, 1, 1]))  # ±0.5, ±0, ±6 certainly present
    row[40:44] = nvfp4_numbers.pack_codes(torch.tensor([15, 7, 9, 1, 8, 0, 14, 6]))
    values = nvfp4_numbers.decode_e2m1(nvfp4_numbers.unpack_codes(row), torch.float64)
    staged = nvfp4_wgmma.repack(row.view(1, 1, 64)).view(torch.int32).flatten().tolist()  # 16 words, as stored
    staged = [w & MASK for w in staged]
    s16 = _bits(scale * nvfp4_wgmma.scale_multiplier(fp16), fp16)
    assert _half(s16, fp16) == scale * nvfp4_wgmma.scale_multiplier(fp16)  # the table's entry is exact
    for j in range(8):  # the MMA's slice j: columns 16j .. 16j+15, one block scale
        asm = nvfp4_wgmma.decode_asm(j, fp16)
        for c in range(4):
            for half in (0, 1):  # k pairs (2c, 2c+1) and (2c+8, 2c+9): positions 2c + 8·half, +1
                p = 2 * c + 8 * half
                got = run_asm(asm, {"$1": staged[p], "$2": staged[p + 1], "$3": s16 | s16 << 16})["$0"]
                col = 16 * j + 8 * half + 2 * c
                want = [float(values[col + i]) * scale / nvfp4_wgmma.out_multiplier(fp16) for i in (0, 1)]
                assert [_half(got & 0xFFFF, fp16), _half(got >> 16, fp16)] == want, (j, c, half)


def test_pick_config_hands_the_gluon_kernel_only_to_a_device_that_has_it(monkeypatch):
    rows, n, k = 512 * 8, 1536, 2048
    cpu = nvfp4.pick_config(rows, 128, n, k, torch.device("cpu"))
    assert "KERNEL" not in cpu and "BLOCK_K" in cpu  # the Triton kernel's configuration
    monkeypatch.setattr(nvfp4_wgmma, "available", lambda device, k: True)
    for tokens, bucket in ((64, "small"), (512, "mid"), (4096, "large")):
        cfg = nvfp4.pick_config(tokens * 8, 128, n, k, torch.device("cuda"))
        assert cfg == dict(nvfp4.WGMMA_TILES[bucket], KERNEL="gluon")


def test_the_gluon_kernel_is_refused_where_it_cannot_run():
    assert not nvfp4_wgmma.available(torch.device("cpu"), 2048)
    w = nvfp4.Nvfp4Experts.from_weights(torch.randn(2, 256, 256))
    x = torch.randn(4, 256)
    offsets = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="sm_90"):
        nvfp4.nvfp4_grouped_mm(x, w.packed, w.block_scale, w.global_scale, offsets,
                               dict(KERNEL="gluon", BLOCK_M=16, BLOCK_N=128, AHEAD=1))


def test_experts_repacked_in_place_dequantize_the_same_and_only_the_gluon_kernel_takes_them():
    torch.manual_seed(1)
    fmt = nvfp4.Nvfp4Experts.from_weights(torch.randn(3, 256, 256))
    before, stored, ptr = fmt.dequantize(torch.float32), fmt.packed.clone(), fmt.packed.data_ptr()
    fmt._relayout("wgmma")
    assert fmt.layout == "wgmma" and fmt.packed.data_ptr() == ptr and not torch.equal(fmt.packed, stored)
    assert torch.equal(fmt.dequantize(torch.float32), before)
    assert torch.equal(fmt.dequantize(torch.float32, torch.tensor([2, 0])), before[[2, 0]])
    x, offsets = torch.randn(4, 256), torch.tensor([2, 4, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="ModelOpt's layout"):
        nvfp4.nvfp4_grouped_mm(x, fmt.packed, fmt.block_scale, fmt.global_scale, offsets, layout="wgmma")
    fmt._relayout("modelopt")
    assert torch.equal(fmt.packed, stored)
