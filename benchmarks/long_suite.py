"""Make a suite of realistic-length decisions: the built-in records with a deterministic `context` in the state,
padded until each question's prompt is `--tokens` tokens long or a few under it, counted with the fixture's tokenizer (the one
synthetic real-shape runs tokenize with; built in seconds, no model needed).

    python benchmarks/long_suite.py --tokens 512 --n 32 --out suite-512.jsonl
"""

from __future__ import annotations

import argparse
import json
import random

from quantbench.make.fixture import build_tokenizer
from quantbench.protocol.prompt import render_prompt
from quantbench.protocol.suite import load_suite

WORDS = ("the report notes that the weather, the schedule and the budget changed again after the meeting "
         "while the team reviewed every open ticket and the customer asked for a short summary").split()


def with_context(tok, req, state: dict, name: str, words: list[str]) -> int:
    """Set req's state to `state` plus a context of `words`; the prompt's length in tokens."""
    req.state = {**state, "context": " ".join(words)}
    return len(tok(render_prompt(tok, req, name))["input_ids"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tok = build_tokenizer()
    rng = random.Random(args.seed)
    records = [r for r in load_suite(None).records if len(r.request.questions) == 1][: args.n]
    with open(args.out, "w") as f:
        for r in records:
            req = r.request.model_copy(deep=True)
            name = next(iter(req.questions))
            words: list[str] = []
            while (n := with_context(tok, req, r.request.state, name, words)) < args.tokens:
                words.extend(rng.choice(WORDS) for _ in range(max(1, (args.tokens - n) // 2)))
            while words and with_context(tok, req, r.request.state, name, words) > args.tokens:
                words.pop()  # grown past the target: cut back to at most it
            with_context(tok, req, r.request.state, name, words)
            rec = {"id": f"{r.id}-{args.tokens}", "benchmark": r.benchmark, "request": req.model_dump(exclude_none=True),
                   "gold": r.gold}
            f.write(json.dumps(rec) + "\n")
    print(f"wrote {len(records)} records of ~{args.tokens} tokens to {args.out}")


if __name__ == "__main__":
    main()
