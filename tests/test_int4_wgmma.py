"""The Gluon INT4 kernel's unpacking (quantbench/moe/int4_wgmma.py) without a GPU: its two PTX snippets, run by a
small interpreter of the five instructions they use, on words packed by int4.pack_k, must give q − z for the rows
each slice feeds the MMA, exactly; and pick_config must hand the kernel only to a device that has it.

The kernel itself runs only on sm_90 (benchmarks/int4_wgmma_gpu.py checks it there against the Triton kernel and
a float64 reference; tests/test_compile_sm90.py compiles it here)."""

from __future__ import annotations

import re

import pytest
import torch

from quantbench.engine.moe import int4, int4_kernels, int4_wgmma

MASK = 0xFFFFFFFF


def _half(bits: int, fp16: bool) -> float:
    return torch.tensor([bits], dtype=torch.int32).to(torch.int16).view(torch.float16 if fp16 else torch.bfloat16).item()


def _bits(v: float, fp16: bool) -> int:
    return int(torch.tensor([v], dtype=torch.float16 if fp16 else torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def run_ptx(asm: str, regs: dict[str, int]) -> dict[str, int]:
    """Interpret the snippets' instructions: mov, shr, prmt, lop3 (0xEA: (a & b) | c), sub / mul.rn.{bf16,f16}x2."""
    body = asm.strip().removeprefix("{").removesuffix("}")
    regs = dict(regs)

    def val(tok: str) -> int:
        tok = tok.strip()
        return regs[tok] if tok in regs else int(tok, 0) & MASK

    for ins in filter(None, (i.strip() for i in body.split(";"))):
        op, _, rest = ins.partition(" ")
        args = [a.strip() for a in rest.split(",")]
        if op == ".reg":
            continue
        if op == "mov.b32":
            regs[args[0]] = val(args[1])
        elif op == "shr.b32":
            regs[args[0]] = val(args[1]) >> int(args[2])
        elif op == "prmt.b32":
            pool = val(args[1]).to_bytes(4, "little") + val(args[2]).to_bytes(4, "little")
            sel = int(args[3], 0)
            regs[args[0]] = int.from_bytes(bytes(pool[(sel >> (4 * i)) & 0x7] for i in range(4)), "little")
        elif op == "lop3.b32":
            assert int(args[4], 0) == 0xEA, ins
            regs[args[0]] = (val(args[1]) & val(args[2])) | val(args[3])
        elif op in ("sub.rn.bf16x2", "sub.rn.f16x2", "mul.rn.bf16x2", "mul.rn.f16x2"):
            fp16 = op.endswith("f16x2") and not op.endswith("bf16x2")
            a, b = val(args[1]), val(args[2])
            # each half's exact result (a double holds it), rounded once to the half's type, as the hardware does
            math = (lambda u, v: u - v) if op.startswith("sub") else (lambda u, v: u * v)
            halves = [_bits(math(_half((a >> s) & 0xFFFF, fp16), _half((b >> s) & 0xFFFF, fp16)), fp16)
                      for s in (0, 16)]
            regs[args[0]] = halves[0] | halves[1] << 16
        else:
            raise AssertionError(f"instruction the interpreter does not know: {ins}")
    return regs


@pytest.mark.parametrize("fp16", [False, True])
def test_unpacking_gives_exact_codes_minus_zero_for_each_slice(fp16):
    torch.manual_seed(0)
    q = torch.randint(0, 16, (128, 3))  # one 128-row block, 3 columns
    z = torch.randint(0, 16, (3,))
    words = int4.pack_k(q.unsqueeze(0), 128)[0]  # [16, 3]: word r holds rows r + 16j in nibble j
    bias = 1024 if fp16 else 128
    for col in range(3):
        zz = _bits(float(bias + int(z[col])), fp16)
        for r in range(0, 16, 2):  # a thread's k pair: words r and r+1
            w0, w1 = (int(words[r + i, col]) & MASK for i in (0, 1))
            ab = run_ptx(int4_wgmma.WORD_HALVES_ASM, {"$2": w0, "$3": w1})
            for j in range(8):
                out = run_ptx(int4_wgmma.pair_asm(j, fp16), {"$1": ab["$0"], "$2": ab["$1"], "$3": zz | zz << 16})["$0"]
                lo, hi = _half(out & 0xFFFF, fp16), _half(out >> 16, fp16)
                rows = 16 * j + r, 16 * j + r + 1
                assert (lo, hi) == tuple(float(q[k, col] - z[col]) for k in rows), (col, r, j)


@pytest.mark.parametrize("fp16", [False, True])
def test_scaled_unpacking_gives_each_weight_rounded_once(fp16):
    """SCALED: (q − z) · s for every slice, rounded once to the MMA's type; the scale is the stored fp16 one
    (fp16: the very weight dequantize() writes) or that scale rounded to bf16 first (the kernel loads it so)."""
    torch.manual_seed(1)
    q = torch.randint(0, 16, (128, 4))
    z = torch.randint(0, 16, (4,))
    scales = torch.randn(4, dtype=torch.float16) * 0.01  # AutoRound's scales can be negative
    words = int4.pack_k(q.unsqueeze(0), 128)[0]
    dtype = torch.float16 if fp16 else torch.bfloat16
    bias = 1024 if fp16 else 128
    for col in range(4):
        zz = _bits(float(bias + int(z[col])), fp16)
        s = scales[col].to(dtype)
        ss = int(s.view(torch.int16).item()) & 0xFFFF
        for r in range(0, 16, 2):
            w0, w1 = (int(words[r + i, col]) & MASK for i in (0, 1))
            ab = run_ptx(int4_wgmma.WORD_HALVES_ASM, {"$2": w0, "$3": w1})
            for j in range(8):
                regs = {"$1": ab["$0"], "$2": ab["$1"], "$3": zz | zz << 16, "$4": ss | ss << 16}
                out = run_ptx(int4_wgmma.scaled_asm(j, fp16), regs)["$0"]
                for half, k in ((out & 0xFFFF, 16 * j + r), (out >> 16, 16 * j + r + 1)):
                    want = torch.tensor(float(q[k, col] - z[col]) * float(s), dtype=torch.float64).to(dtype)
                    assert _half(half, fp16) == float(want), (col, r, j)
    # fp16: exactly what dequantize() writes for an fp16 model
    w = int4.Int4Experts(int4.pack_k(q.unsqueeze(0), 128), scales.view(1, 1, 4), z.to(torch.uint8).view(1, 1, 4),
                         128, sym=False, k_block=128)
    dq = w.dequantize(torch.float16, use_triton=False)[0].transpose(0, 1)  # [K, N]
    assert torch.equal(dq, ((q - z).double() * scales.double()).to(torch.float16))


def test_pair_asm_uses_the_right_half_and_shift():
    for j in range(8):
        asm = int4_wgmma.pair_asm(j, False)
        src = re.search(r"(?:shr|mov)\.b32 t, (\$\d)", asm).group(1)
        assert src == ("$1" if j < 4 else "$2")
        assert ("shr.b32" in asm) == (j % 4 != 0)


def test_pick_config_hands_the_gluon_kernel_only_to_a_device_that_has_it(monkeypatch):
    rows, n, k = 512 * 8, 1536, 2048
    cpu = int4_kernels.pick_config(rows, 128, n, k, 128, True, torch.device("cpu"))
    assert "KERNEL" not in cpu and cpu["SWAP_AB"]  # the Triton kernel's configuration
    monkeypatch.setattr(int4_wgmma, "available", lambda device, group_size, k: True)
    for tokens, bucket in ((64, "small"), (512, "mid"), (4096, "large")):
        cfg = int4_kernels.pick_config(tokens * 8, 128, n, k, 128, True, torch.device("cuda"))
        assert cfg == dict(int4_kernels.WGMMA_TILES[bucket], KERNEL="gluon")



def test_gate_up_dequantizes_at_the_row_count_measured_per_kernel():
    """The Gluon kernel beat dequantize + grouped_mm at 512 to 2,048 rows per expert on the H200 (975.5 against
    1,407.9 us at 512; benchmarks/dequant_threshold.py beyond): it never hands gate_up over. The Triton kernel did
    not (its crossover, 512, stays)."""
    n, k, experts = 1536, 2048, 128
    assert int4_kernels.dequantize_instead("triton", n, k, 512 * experts, experts)
    assert not int4_kernels.dequantize_instead("gluon", n, k, 512 * experts, experts)
    assert not int4_kernels.dequantize_instead("gluon", n, k, 4096 * experts, experts)
    assert not int4_kernels.dequantize_instead("triton", n, k, 511 * experts, experts)
    assert not int4_kernels.dequantize_instead("gluon", 2048, 768, 4096 * experts, experts)  # down: always fused

def test_the_gluon_kernel_is_refused_where_it_cannot_run():
    assert not int4_wgmma.available(torch.device("cpu"), 128, 2048)
    w = int4.rtn_experts(torch.randn(2, 256, 256))
    x = torch.randn(4, 256)
    offsets = torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="sm_90"):
        int4_kernels.int4_grouped_mm(x, w.qweight, w.scales, w.zeros, offsets, 128, dict(KERNEL="gluon", BLOCK_M=16,
                                                                                  BLOCK_N=64))
