"""The Gluon NVFP4 kernel's decoding (quantbench/moe/nvfp4_wgmma.py) without a GPU: its PTX, run by a small
interpreter over the four lanes of a quad in lockstep (the transpose's shuffles read the other lanes), on a row
packed by nvfp4.pack_codes and staged as the kernel stages it (even words first), must give each lane exactly
value · block scale · 2^-8 (bf16; 2^-7 fp16) for the columns of each 16-column slice it feeds the MMA, E2M1's
0.5 (a 16-bit subnormal before the multiply) and E4M3's subnormal scales included; and pick_config must hand the
kernel only to a device that has it.

The kernel itself runs only on sm_90 (benchmarks/nvfp4_wgmma_gpu.py checks it there against the Triton kernel
and a float64 reference, including a multiply of subnormals on the hardware; tests/test_compile_sm90.py compiles
it here)."""

from __future__ import annotations

import pytest
import torch

from quantbench.moe import nvfp4, nvfp4_wgmma

MASK = 0xFFFFFFFF


def _half(bits: int, fp16: bool) -> float:
    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16 if fp16 else torch.bfloat16).item()


def _bits(v: float, fp16: bool) -> int:
    t = torch.tensor([v], dtype=torch.float64).to(torch.float16 if fp16 else torch.bfloat16)
    return int(t.view(torch.int16).item()) & 0xFFFF


def run_quad(asm: str, lanes: list[dict[str, int]]) -> list[dict[str, int]]:
    """Each instruction for every lane before the next (shfl.sync.bfly reads the partner lane's register):
    shfl, prmt, bfe, mul.lo, and, lop3 (0xEA: (a & b) | c), mul.rn.{bf16,f16}x2."""
    body = asm.strip().removeprefix("{").removesuffix("}")
    regs = [dict(r) for r in lanes]

    def val(r: dict, tok: str) -> int:
        return r[tok] if tok in r else int(tok, 0) & MASK

    for ins in filter(None, (i.strip() for i in body.split(";"))):
        op, _, rest = ins.partition(" ")
        a = [x.strip() for x in rest.split(",")]
        if op == ".reg":
            continue
        out = []
        for lane, r in enumerate(regs):
            if op == "shfl.sync.bfly.b32":
                v = val(regs[lane ^ int(a[2], 0)], a[1])
            elif op == "prmt.b32":
                pool = val(r, a[1]).to_bytes(4, "little") + val(r, a[2]).to_bytes(4, "little")
                v = int.from_bytes(bytes(pool[(val(r, a[3]) >> (4 * i)) & 7] for i in range(4)), "little")
            elif op == "bfe.u32":
                v = (val(r, a[1]) >> int(a[2])) & ((1 << int(a[3])) - 1)
            elif op == "mul.lo.u32":
                v = (val(r, a[1]) * val(r, a[2])) & MASK
            elif op == "and.b32":
                v = val(r, a[1]) & val(r, a[2])
            elif op == "lop3.b32":
                assert int(a[4], 0) == 0xEA, ins
                v = (val(r, a[1]) & val(r, a[2])) | val(r, a[3])
            elif op in ("mul.rn.bf16x2", "mul.rn.f16x2"):
                fp16 = op == "mul.rn.f16x2"
                x, y = val(r, a[1]), val(r, a[2])
                h = [_bits(_half((x >> s) & 0xFFFF, fp16) * _half((y >> s) & 0xFFFF, fp16), fp16) for s in (0, 16)]
                v = h[0] | h[1] << 16
            else:
                raise AssertionError(f"instruction the interpreter does not know: {ins}")
            out.append(v)
        for r, v in zip(regs, out, strict=True):
            r[a[0]] = v
    return regs


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("scale", [2.0**-9, 2.0**-7 * 1.625, 1.25, 448.0])  # E4M3: subnormal, small, 1.25, max
def test_each_lane_decodes_exactly_the_codes_of_its_slice(fp16, scale):
    torch.manual_seed(int(scale * 1000))
    row = torch.randint(0, 256, (64,), dtype=torch.uint8)  # one row's 128-column block, as ModelOpt packs it
    row[:4] = nvfp4.pack_codes(torch.tensor([1, 9, 0, 8, 7, 15, 1, 1]))  # ±0.5, ±0, ±6 certainly present
    values = nvfp4.decode_e2m1(nvfp4.unpack_codes(row), torch.float64)
    words = [int.from_bytes(bytes(row[4 * w: 4 * w + 4].tolist()), "little") for w in range(16)]
    staged = [words[2 * (p % 8) + p // 8] for p in range(16)]  # the kernel's shared memory: even words first
    held = {}  # (lane, A operand position) -> the word after the quad's exchange
    for pos in (0, 1, 8, 9):  # lane c holds positions 2c + pos of the row in the A operand layout
        sel = [nvfp4_wgmma.quad_selectors(c) for c in range(4)]
        out = run_quad(nvfp4_wgmma.QUAD_TRANSPOSE_ASM,
                       [{"$1": staged[2 * c + pos], "$2": sel[c][0], "$3": sel[c][1]} for c in range(4)])
        for c in range(4):
            held[c, pos] = out[c]["$0"]
    s16 = _bits(scale * nvfp4_wgmma.scale_multiplier(fp16), fp16)
    assert _half(s16, fp16) == scale * nvfp4_wgmma.scale_multiplier(fp16)  # the table's entry is exact
    for s in range(8):  # the MMA's slice s: columns 16s .. 16s+15, one block scale
        for c in range(4):
            for half, (p1, p2) in enumerate(((0, 1), (8, 9))):  # k pairs (2c, 2c+1) and (2c+8, 2c+9)
                lane = {"$1": held[c, p1], "$2": held[c, p2], "$3": s16 | s16 << 16}
                got = run_quad(nvfp4_wgmma.decode_asm(s, fp16), [lane])[0]["$0"]
                col = 16 * s + 8 * half + 2 * c
                want = [float(values[col + i]) * scale / nvfp4_wgmma.out_multiplier(fp16) for i in (0, 1)]
                assert [_half(got & 0xFFFF, fp16), _half(got >> 16, fp16)] == want, (s, c, half)


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
