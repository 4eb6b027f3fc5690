"""quantbench.engine.fused.ops against transformers' own ops on a GPU: how many elements are bit-identical, the largest
difference, and the time of each (one kernel against transformers' op chain), at the Qwen3-30B-A3B shapes of one
512-token decision.

    python benchmarks/fused_ops_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantbench.engine.fused.ops import apply_rope, rms_norm  # noqa: E402


def same(label: str, want: torch.Tensor, got: torch.Tensor) -> None:
    diff = (want.float() - got.float()).abs()
    print(f"{label}: {100 * float((want == got).float().mean()):.3f}% bit-identical, max |diff| {float(diff.max()):.3g} "
          f"(max |value| {float(want.float().abs().max()):.3g})", flush=True)


def main() -> None:
    # lazy: transformers takes seconds to import and Triton is optional; only the GPU check runs this
    from transformers.models.qwen3_moe import modeling_qwen3_moe as mq
    from triton.testing import do_bench

    torch.manual_seed(0)
    dev, dt, t = "cuda", torch.bfloat16, 512
    for name, n, shape in (("input norm", 2048, (1, t, 2048)), ("q_norm", 128, (1, t, 32, 128))):
        norm = mq.Qwen3MoeRMSNorm(n, eps=1e-6).to(dev, dt)
        norm.weight.data = (1 + 0.1 * torch.randn(n, device=dev)).to(dt)
        x = (torch.randn(*shape, device=dev) * 2).to(dt)
        same(f"RMSNorm {name} {list(shape)}", norm(x), rms_norm(x, norm.weight, norm.variance_epsilon))
        print(f"  transformers {do_bench(lambda norm=norm, x=x: norm(x)) * 1e3:.1f} us, fused "
              f"{do_bench(lambda norm=norm, x=x: rms_norm(x, norm.weight, norm.variance_epsilon)) * 1e3:.1f} us", flush=True)
    q = torch.randn(1, t, 32, 128, device=dev).to(dt).transpose(1, 2)
    k = torch.randn(1, t, 4, 128, device=dev).to(dt).transpose(1, 2)
    pos = torch.arange(t, device=dev, dtype=torch.float32)
    freqs = pos[:, None] / (1e6 ** (torch.arange(0, 128, 2, device=dev).float() / 128))[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[None]
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    want, got = mq.apply_rotary_pos_emb(q, k, cos, sin), apply_rope(q, k, cos, sin)
    same("rotary q", want[0], got[0])
    same("rotary k", want[1], got[1])
    rot = torch.cat([-q[..., 64:], q[..., :64]], dim=-1)
    once = (q.float() * cos[:, None].float() + rot.float() * sin[:, None].float()).to(dt)
    same("  rotary q vs one rounding of the exact sum", once, got[0])
    bad = (want[0] != got[0]).nonzero()[:4].tolist()
    for b, h, t_, d in bad:  # what the differing elements are made of
        half = d % 64
        x1, x2 = float(q[b, h, t_, half]), float(q[b, h, t_, half + 64])
        c, s_ = float(cos[b, t_, d]), float(sin[b, t_, d])
        print(f"    [{h},{t_},{d}] q1 {x1!r} q2 {x2!r} cos {c!r} sin {s_!r}: transformers "
              f"{float(want[0][b, h, t_, d])!r}, fused {float(got[0][b, h, t_, d])!r}")
    print(f"  transformers {do_bench(lambda: mq.apply_rotary_pos_emb(q, k, cos, sin)) * 1e3:.1f} us, fused "
          f"{do_bench(lambda: apply_rope(q, k, cos, sin)) * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
