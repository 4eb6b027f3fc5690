"""Make a big text suite: the built-in records over and over, each copy with its own id and a varied first string
of its state (a copy number and words from a fixed list), until the file holds `--records` records. For timing what
reading a suite costs (`quantbench run --limit 5` on a 100 MB+ file); nothing here is meant to be answered well.

    python benchmarks/big_suite.py --records 300000 --out /tmp/big.jsonl
"""

from __future__ import annotations

import argparse
import json
import random

from quantbench.protocol.suite import BUILTIN_SUITE

WORDS = ("please kindly urgent today tomorrow later again also maybe now the a my our your this that every "
         "account report meeting budget schedule weather ticket summary customer order table flight").split()


def varied(record: dict, copy: int, rng: random.Random) -> dict:
    """`record` as copy number `copy`: its own id, and its state's first string value longer by a few words."""
    state = dict(record["request"]["state"])
    key = next((k for k, v in state.items() if isinstance(v, str)), None)
    if key is not None:  # a state of numbers only (compare) keeps its values; its id still differs
        state[key] = f"{state[key]} ({copy}: {' '.join(rng.choices(WORDS, k=rng.randint(2, 12)))})"
    return {**record, "id": f"{record['id']}-{copy}", "request": {**record["request"], "state": state}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = [json.loads(line) for line in BUILTIN_SUITE.read_text().splitlines() if line.strip()]
    with open(args.out, "w") as f:
        for n in range(args.records):
            f.write(json.dumps(varied(base[n % len(base)], n // len(base), rng)) + "\n")
    print(f"wrote {args.records} records to {args.out}")


if __name__ == "__main__":
    main()
