"""The routing kernels (quantbench.engine.moe.routing) against torch's CUDA ops on a GPU: exactness and speed.

    python3 benchmarks/routing_gpu.py

1. route_topk against softmax(float32) + topk + renormalisation + cast on random logits (E 8..1024, k 1..32,
   bf16 / fp16 / fp32): rows whose indices, index sets and values differ (rows with tied probabilities counted
   apart: torch lists tied experts in no fixed order)
   3. exact ties
   4. sum_slots against an in-order float32 sum
   and torch's sum
   5. times (CUDA-graph replays: kernel time without launch overhead)
   the route kernel's
   registers, spills and a sweep of rows per program x warps
   6. an engine layer with the kernels against the
   torch ops, and its CUDA-graph replay against eager. The H200 figures are in docs/BENCHMARKS.md.
"""
import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench_cudagraph

import quantbench.engine.moe.engine as eng
from quantbench.engine.moe import routing
from quantbench.engine.moe.routing import route_topk, sum_slots

dev = "cuda"
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, torch.cuda.get_device_name())

def torch_route(logits, k, norm):
    probs = torch.softmax(logits, dtype=torch.float, dim=-1)
    v, i = torch.topk(probs, k, dim=-1)
    if norm:
        v /= v.sum(dim=-1, keepdim=True)
    return v.to(logits.dtype), i

def bits(v):
    return v.view(torch.int16) if v.element_size() == 2 else v.view(torch.int32)

# 1. exactness on random logits
torch.manual_seed(0)
tot = dict(rows=0, tie_rows=0, idx_bad=0, idxset_bad=0, val_bad=0)
worst = []
for e in (8, 32, 60, 64, 128, 160, 256, 512, 1000, 1024):
    for k in sorted({1, 2, 6, 8, min(e, 32)}):
        for dt in (torch.float32, torch.bfloat16, torch.float16):
            for norm in (False, True):
                for scale in (1.0, 6.0, 40.0):
                    t = 2053
                    logits = (torch.randn(t, e, device=dev) * scale).to(dt)
                    v, i = route_topk(logits, k, norm)
                    wv, wi = torch_route(logits, k, norm)
                    p = torch.softmax(logits, dtype=torch.float, dim=-1)
                    srt = p.sort(-1, descending=True).values
                    kk = min(k + 1, e)
                    ties = (srt[:, : kk - 1] == srt[:, 1:kk]).any(-1) if kk > 1 else torch.zeros(t, dtype=torch.bool, device=dev)
                    idx_bad = ((i != wi).any(-1) & ~ties).sum().item()
                    idxset_bad = (i.sort(-1).values != wi.sort(-1).values).any(-1).sum().item()
                    val_bad = (bits(v) != bits(wv)).any(-1).sum().item()
                    for key, n in (("rows", t), ("tie_rows", ties.sum().item()), ("idx_bad", idx_bad),
                                   ("idxset_bad", idxset_bad), ("val_bad", val_bad)):
                        tot[key] += n
                    if idx_bad or val_bad or idxset_bad:
                        worst.append((e, k, str(dt), norm, scale, idx_bad, idxset_bad, val_bad))
print("route exactness totals", tot)
for w in worst[:40]:
    print("  mismatch e k dt norm scale idx_bad idxset_bad val_bad:", w)

# softmax alone: all probabilities (k = e <= 32, fp32, no renorm), values bitwise
for e in (8, 17, 32):
    logits = torch.randn(4099, e, device=dev) * 5
    v, _ = route_topk(logits, e, False)
    wv, _ = torch_route(logits, e, False)
    print("softmax all-probs e", e, "rows differing", (bits(v) != bits(wv)).any(-1).sum().item())

# 2. torch's order for the renormalisation sum
def pair_rule(v):
    k = v.shape[1]
    kp2 = triton.next_power_of_2(k)
    s = F.pad(v, (0, kp2 - k))
    if kp2 != k:
        s = s[:, : kp2 // 2] + s[:, kp2 // 2 :]
    while s.shape[1] > 1:
        s = s[:, 0::2] + s[:, 1::2]
    return s[:, 0]
def seq_rule(v):
    s = v[:, 0].clone()
    for j in range(1, v.shape[1]):
        s = s + v[:, j]
    return s
def halves_rule(v):
    k = v.shape[1]
    kp2 = triton.next_power_of_2(k)
    s = F.pad(v, (0, kp2 - k))
    while s.shape[1] > 1:
        h = s.shape[1] // 2
        s = s[:, :h] + s[:, h:]
    return s[:, 0]
for t in (1, 512, 4099):
    for k in (2, 3, 4, 5, 6, 7, 8, 12, 16, 32):
        v = torch.rand(t, 64, device=dev).topk(k, -1).values
        s = v.sum(-1)
        print(f"renorm sum t={t} k={k}: pair {(s == pair_rule(v)).float().mean().item():.4f} "
              f"seq {(s == seq_rule(v)).float().mean().item():.4f} halves {(s == halves_rule(v)).float().mean().item():.4f}")

# 3. exact ties
for dt in (torch.float32, torch.bfloat16):
    logits = torch.randint(-2, 3, (4099, 128), device=dev).to(dt)
    v, i = route_topk(logits, 8, True)
    wv, wi = torch_route(logits, 8, True)
    # within each run of equal values, does torch list lower experts first?
    same = (i == wi).all(-1).float().mean().item()
    sets = (i.sort(-1).values == wi.sort(-1).values).all(-1).float().mean().item()
    vals = (bits(v) == bits(wv)).all(-1).float().mean().item()
    eqv = wv.float()[:, 1:] == wv.float()[:, :-1]
    torch_low_first = ((wi[:, 1:] > wi[:, :-1]) | ~eqv).all(-1).float().mean().item()
    print(f"ties {dt}: rows with identical index order {same:.4f}, same index set {sets:.4f}, values bitwise {vals:.4f}, "
          f"torch rows listing tied experts low-first {torch_low_first:.4f}")

# 4. sum_slots
for dt in (torch.bfloat16, torch.float16, torch.float32):
    for t in (512, 16384):
        w = torch.randn(t, 8, 2048, device=dev).to(dt)
        got = sum_slots(w)
        acc = w[:, 0].float()
        for j in range(1, 8):
            acc = acc + w[:, j].float()
        seq = acc.to(dt)
        want = w.sum(1)
        print(f"sum_slots {dt} t={t}: == sequential fp32 {(bits(got) == bits(seq)).float().mean().item():.6f}, "
              f"== torch sum {(bits(got) == bits(want)).float().mean().item():.6f}, "
              f"torch == sequential {(bits(want) == bits(seq)).float().mean().item():.6f}")

# 5. timing (CUDA graphs: kernel time without Python launch overhead)
logits = torch.randn(512, 128, device=dev).bfloat16()
for norm in (True,):
    tk = do_bench_cudagraph(lambda norm=norm: route_topk(logits, 8, norm))
    tt = do_bench_cudagraph(lambda norm=norm: torch_route(logits, 8, norm))
    print(f"route 512x128 top-8 norm={norm}: kernel {tk*1e3:.2f} us, torch ops {tt*1e3:.2f} us")
big = torch.randn(16384, 128, device=dev).bfloat16()
print(f"route 16384x128: kernel {do_bench_cudagraph(lambda: route_topk(big, 8, True))*1e3:.2f} us, torch {do_bench_cudagraph(lambda: torch_route(big, 8, True))*1e3:.2f} us")
for t in (512, 16384):
    w = torch.randn(t, 8, 2048, device=dev).bfloat16()
    ts = do_bench_cudagraph(lambda w=w: sum_slots(w))
    tt = do_bench_cudagraph(lambda w=w: w.sum(1))
    print(f"sum_slots t={t} H=2048 k=8 bf16: kernel {ts*1e3:.2f} us ({w.numel()*2/ts/1e9:.2f} TB/s), torch sum {tt*1e3:.2f} us")

# registers / spills as compiled here, and a sweep of the route kernel's rows per program and warps
try:
    rk, sk = routing._kernels()
    for kern in (rk, sk):
        for c in kern.device_caches[0][0].values():
            c._init_handles()
            print(kern.fn.__name__, "regs", c.n_regs, "spills", c.n_spills)
except Exception as ex:
    print("regs: failed", ex)
for t in (512, 16384):
    lg = torch.randn(t, 128, device=dev).bfloat16()
    vals = torch.empty(t, 8, dtype=lg.dtype, device=dev)
    idx = torch.empty(t, 8, dtype=torch.int64, device=dev)
    for bt in (1, 2, 4, 8, 16):
        for nw in (1, 2, 4, 8):
            def f(t=t, bt=bt, nw=nw, lg=lg, vals=vals, idx=idx):
                return rk[(triton.cdiv(t, bt),)](lg, vals, idx, t, 128, E=128, K=8, K_P2=8, NORM=True, LANES=32, ITERS=4,
                                                   BLOCK_T=bt, INTERPRET=False, num_warps=nw, enable_reflect_ftz=False)
            print(f"sweep t={t} BLOCK_T={bt} warps={nw}: {do_bench_cudagraph(f)*1e3:.2f} us")

# 6. the engine: kernels vs torch path, and CUDA-graph capture
torch.manual_seed(1)
E, H, INTER, K, T = 128, 256, 64, 8, 96
gate = torch.nn.Linear(H, E, bias=False).to(dev).bfloat16()
moe = eng.GroupedMoE(gate, eng.DenseExperts((torch.randn(E, 2 * INTER, H, device=dev) / 16).bfloat16()),
                     eng.DenseExperts((torch.randn(E, H, INTER, device=dev) / 8).bfloat16()), top_k=K, norm_topk_prob=True)
x = torch.randn(T, H, device=dev).bfloat16()
with torch.inference_mode():
    got = moe(x)
    fits, ss = eng.route_fits, eng.sum_slots
    eng.route_fits, eng.sum_slots = (lambda *a: False), (lambda w: w.sum(1))
    want = moe(x)
    eng.route_fits, eng.sum_slots = fits, ss
    print("engine kernels vs torch ops: elements equal", (bits(got) == bits(want)).float().mean().item(),
          "max abs diff", (got.float() - want.float()).abs().max().item(), "path", moe.kernel_path)
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        moe(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = moe(static_x)
    static_x.copy_(torch.randn(T, H, device=dev).bfloat16())
    g.replay()
    torch.cuda.synchronize()
    print("cuda graph replay == eager:", torch.equal(out, moe(static_x)))
print("done")
