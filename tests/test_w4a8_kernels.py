"""The W4A8 activation quantizer's Triton kernel (quantbench.engine.moe.w4a8_kernels) under Triton's CPU
interpreter, against the torch statement of the same contract (w4a8.quantize_rows): the same codes, scales and
zero-point terms, ties and empty groups included. (The GEMM is a Gluon kernel: compiled here by
tests/test_compile_sm90.py, checked against float64 on the H200 by benchmarks/w4a8_gpu.py.)"""

import pytest

from tests.interpreted import run_interpreted

pytest.importorskip("triton")

CODE = """
import torch
from quantbench.engine.moe import w4a8, w4a8_kernels
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    x = (torch.randn(64, 384) * 3).to(dtype)          # 192 groups: a scale off by an ulp shows
    x[1, 128:256] = 0                                   # a group of zeros: codes 0, scale 0
    x[2, :128] = torch.arange(128) - 63.5               # with 127 in the group: 127 / amax is 1, so every
    x[2, 0] = 127                                       # value is a code and a half (ties to even)
    x[3, 256:] = torch.linspace(-1, 1, 128)
    if dtype != torch.float16:                           # below w4a8.TINY: zeros (127 / amax would overflow)
        x[4, :128] = torch.full((128,), 1e-37).to(dtype)
    xq, sx, sxs = w4a8_kernels.quantize_rows(x, w4a8.TINY)
    want_q, want_sx, want_sum = w4a8.quantize_rows(x)
    assert xq.dtype == torch.int8 and torch.equal(xq, want_q), (dtype, (xq != want_q).sum())
    assert torch.equal(sx, want_sx), dtype
    assert torch.equal(sxs, want_sx * want_sum.float()), dtype
    assert torch.equal(sx[1, 1], torch.tensor(0.0)) and not xq[1, 128:256].any()
    if dtype != torch.float16:
        assert sx[4, 0] == 0 and not xq[4, :128].any() and not torch.isnan(sxs).any()
    halves = x[2, 1:128].float()
    assert torch.equal(xq[2, 1:128], torch.round(halves).to(torch.int8)) and xq[2, 1] == -62 and xq[2, 2] == -62
empty = w4a8_kernels.quantize_rows(torch.zeros(0, 256), w4a8.TINY)
assert [tuple(t.shape) for t in empty] == [(0, 256), (0, 2), (0, 2)]
print("ok")
"""


def test_the_quantizer_kernel_gives_the_torch_codes_scales_and_sums():
    run_interpreted(CODE)
