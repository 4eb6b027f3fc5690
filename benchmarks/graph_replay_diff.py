"""Why a decoder's CUDA-graph replay differs from the same forward run eagerly, and by how much against the spread
of two valid kernels: the text decoder of a real-shape model (random weights, `--shape`), on one static input.

For each variant and each setting (as is; attention pinned to one SDPA backend; without PDL; without the fused
ops), in this order:
  - replay vs replay and eager vs eager (each must be 0: a graph or a forward that is not deterministic);
  - replay vs eager, as the mean relative error of the last hidden states and the total variation of the
    next-token distribution at each row's last position (the whole vocabulary);
  - where the first difference arises: every module of the first `--probe-layers` decoder layers records its
    output (a clone, captured into the graph), and the first module whose replayed output differs from its eager
    output is named, with the largest difference;
  - the spread of two valid kernels: the same input through a second experts kernel (bf16: transformers'
    grouped_mm against quantbench's engine) eagerly, the same two measures.

    python benchmarks/graph_replay_diff.py --shape qwen3-omni-30b-a3b --variants bf16,int4 --layers 48
    QUANTBENCH_PDL=0 python benchmarks/graph_replay_diff.py ...      # PDL off for the whole process
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Recorder:
    """Forward hooks on every module of the first layers: each call's output cloned, in call order. Under a
    capture the clones are the graph's own tensors, so after a replay they hold the replayed values."""

    def __init__(self, layers: list[Any]):
        self.on = False
        self.out: list[tuple[str, Any]] = []
        self.hooks = []
        for i, layer in enumerate(layers):
            for name, module in layer.named_modules():
                self.hooks.append(module.register_forward_hook(self._hook(f"layers.{i}.{name}".rstrip("."))))

    def _hook(self, name: str):
        def hook(_m, _args, output):
            if not self.on:
                return None
            t = output[0] if isinstance(output, tuple) else output
            if hasattr(t, "detach"):
                self.out.append((name, t.detach().clone()))
            return None

        return hook

    @contextlib.contextmanager
    def recording(self):
        self.out, self.on = [], True
        try:
            yield self
        finally:
            self.on = False

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def relative(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().mean() / b.abs().mean().clamp_min(1e-12))


def tv_last(model: Any, a: Any, b: Any) -> float:
    """Mean over rows of the total variation between the next-token distributions at the last position."""
    import torch

    head = model.get_output_embeddings()
    with torch.no_grad():
        return _tv(head, a, b)


def _tv(head: Any, a: Any, b: Any) -> float:
    import torch

    pa = torch.softmax(head(a[:, -1]).float(), -1)
    pb = torch.softmax(head(b[:, -1]).float(), -1)
    return float(0.5 * (pa - pb).abs().sum(-1).mean())


def first_difference(eager: list, replay: list) -> dict[str, Any]:
    names_e = [n for n, _ in eager]
    names_r = [n for n, _ in replay]
    if names_e != names_r:
        return {"call_order_differs": True, "eager": names_e[:40], "replay": names_r[:40]}
    for (name, e), (_, r) in zip(eager, replay, strict=True):
        if e.shape != r.shape:
            return {"module": name, "shape_differs": [list(e.shape), list(r.shape)]}
        diff = (e.float() - r.float()).abs()
        if float(diff.max()) > 0:
            return {"module": name, "max_abs": float(diff.max()), "mean_relative": relative(r, e),
                    "differing_elements": float((diff > 0).float().mean()), "dtype": str(e.dtype),
                    "shape": list(e.shape)}
    return {"module": None, "modules_compared": len(eager)}


def compare(model: Any, decoder: Any, embeds: Any, positions: Any, probe_layers: int, attention: str | None) -> dict:
    import torch

    kwargs = dict(inputs_embeds=embeds, position_ids=positions, use_cache=False)
    pin = contextlib.nullcontext()
    if attention:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        pin = sdpa_kernel([getattr(SDPBackend, attention)])
    recorder = Recorder(list(decoder.layers[:probe_layers]))
    try:
        with torch.inference_mode(), pin:
            e1 = decoder(**kwargs).last_hidden_state.clone()
            with recorder.recording():
                e2 = decoder(**kwargs).last_hidden_state.clone()
            eager_steps = recorder.out
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    decoder(**kwargs)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with recorder.recording(), torch.cuda.graph(graph):
                static = decoder(**kwargs).last_hidden_state
            replay_steps = recorder.out
            graph.replay()
            r1 = static.clone()
            graph.replay()
            torch.cuda.synchronize()
            r2 = static.clone()
            out = {"eager_vs_eager": relative(e2, e1), "replay_vs_replay": relative(r2, r1),
                   "replay_vs_eager": relative(r1, e1), "replay_vs_eager_tv": tv_last(model, r1, e1),
                   "first_difference": first_difference(eager_steps, replay_steps)}
            del graph, static
    finally:
        recorder.remove()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen3-omni-30b-a3b")
    p.add_argument("--variants", default="bf16,int4")
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--probe-layers", type=int, default=2)
    p.add_argument("--settings", default="as-is,FLASH_ATTENTION,EFFICIENT_ATTENTION,CUDNN_ATTENTION,MATH")
    p.add_argument("--fused-off", action="store_true", help="also build each variant with the fused ops off")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch

    from quantbench.run.backend import get_backend
    from quantbench.run.machine import detect
    from quantbench.run.spec import RunSpec

    machine = detect()
    results: dict[str, Any] = {"torch": torch.__version__, "pdl": os.environ.get("QUANTBENCH_PDL", "1")}
    settings = args.settings.split(",")
    for variant in args.variants.split(","):
        backend, _, options = variant.partition(":")
        opts = dict(kv.split("=") for kv in options.split(";") if kv)
        for fused in ("auto", "off") if args.fused_off else ("auto",):
            say(f"{variant}: building ({args.layers} layers, fused ops {fused}) …")
            spec = RunSpec(backend=backend, shape=args.shape, layers=args.layers, seed=0, device="cuda:0",
                           fused_ops=fused, **opts)
            loaded = get_backend(backend).load(spec, machine)
            model, decoder = loaded.model, loaded.model.get_decoder()
            gen = torch.Generator(device="cuda").manual_seed(1)
            ids = torch.randint(0, 150000, (args.rows, args.tokens), generator=gen, device="cuda")
            with torch.inference_mode():
                embeds = model.get_input_embeddings()(ids)
            positions = torch.arange(args.tokens, device="cuda").expand(3, args.rows, args.tokens).contiguous()
            for setting in settings if fused == "auto" else ["as-is"]:
                attention = None if setting == "as-is" else setting
                name = f"{variant}/fused-{fused}/{setting}"
                say(f"{name}: comparing …")
                try:
                    got = compare(model, decoder, embeds, positions, args.probe_layers, attention)
                except Exception as exc:  # noqa: BLE001 - a backend that cannot be pinned is a result too
                    got = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                say(f"{name}: {json.dumps(got)}")
                results[name] = got
            if backend == "bf16" and fused == "auto":
                from backends.bf16 import set_experts_implementation

                with torch.inference_mode():
                    a = decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False).last_hidden_state.clone()
                    other = "grouped_mm" if opts.get("experts_impl") == "quantbench" else "quantbench"
                    set_experts_implementation(model, other)
                    b = decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False).last_hidden_state.clone()
                spread = {"other": other, "relative": relative(b, a), "tv": tv_last(model, b, a)}
                say(f"{variant}: two valid experts kernels, eagerly: {json.dumps(spread)}")
                results[f"{variant}/two-kernels"] = spread
            del loaded, model, decoder, embeds
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
