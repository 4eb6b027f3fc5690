"""The host side of a text decision as `serve` runs it (parse, check, tokenize: what Server-Timing calls prepare),
without a model: the embedded fixture's engine and tokenizer (the 30B shape serves with the same tokenizer) on
512-token decisions, each phase timed, in a fresh process per setting of TOKENIZERS_PARALLELISM (tokenizers hands
even a batch of one text to its rayon pool unless that is "false": a thread hand-off per call).

    python benchmarks/text_prepare.py [--tokens 512] [--reps 20]

Needs the fixture in $QUANTBENCH_CACHE (carry its models/ folder to a GPU host).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
from quantbench.limits import Limits
from quantbench.run.backend import get_backend
from quantbench.run.machine import detect
from quantbench.run.resolve import resolve
from quantbench.run.spec import RunSpec
from quantbench.server.schema import bound_long_state, decode_request

bodies, reps = json.loads(sys.stdin.read()), int(sys.argv[1])
engine = get_backend("bf16").load(resolve(RunSpec(backend="bf16", device="cpu")), detect()).engine
limits = Limits()
rust = engine.tokenizer.backend_tokenizer
texts = [json.loads(b)["state"]["context"] for b in bodies]

def parse(b):
    return bound_long_state(engine, decode_request(b.encode(), limits=limits, modalities=engine.modalities))[0]

phases = {
    "parse + check": lambda i: parse(bodies[i]),
    "prepare (parse, check, tokenize)": lambda i: engine.prepare(parse(bodies[i])),
    "tokenizer alone (encode_batch_fast)": lambda i: rust.encode_batch_fast([texts[i]], add_special_tokens=False),
    "tokenizer alone (encode)": lambda i: rust.encode(texts[i], add_special_tokens=False),
}
out = {}
for name, fn in phases.items():
    for i in range(len(bodies)):  # warm: the engine's first prompts are checked against transformers' wrapper
        fn(i)
    times = []
    for _ in range(reps):
        for i in range(len(bodies)):
            t = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t) * 1000.0)
    out[name] = statistics.median(times)
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    suite = Path(f"/tmp/text_prepare_{args.tokens}.jsonl")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "long_suite.py"), "--tokens", str(args.tokens),
                    "--n", str(args.n), "--out", str(suite)], check=True, capture_output=True)
    bodies = [json.dumps(json.loads(line)["request"]) for line in suite.read_text().splitlines()]
    print(f"{len(bodies)} decisions of ~{args.tokens} tokens, {args.reps} reps each; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    results = {}
    for setting in ("(unset)", "false", "true"):
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        env.pop("TOKENIZERS_PARALLELISM", None)
        if setting != "(unset)":
            env["TOKENIZERS_PARALLELISM"] = setting
        t = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.reps)], input=json.dumps(bodies), env=env,
                              capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-2000:])
            return 1
        results[setting] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  TOKENIZERS_PARALLELISM={setting}: {time.perf_counter() - t:.1f} s")
    names = list(next(iter(results.values())))
    print(f"\n{'median ms a decision':<40}" + "".join(f"{'PARALLELISM=' + s:>22}" for s in results))
    for name in names:
        print(f"{name:<40}" + "".join(f"{results[s][name]:>22.3f}" for s in results))
    base = results["(unset)"]["prepare (parse, check, tokenize)"]
    print(f"\nprepare, false / unset: {results['false']['prepare (parse, check, tokenize)'] / base:.2f} "
          f"(medians of {args.reps * len(bodies)} timings each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
