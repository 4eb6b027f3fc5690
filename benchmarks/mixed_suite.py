"""A suite of mixed text and picture decisions for `quantbench load` against a Qwen3-Omni server: the records of a
text suite (benchmarks/long_suite.py's, ~512 tokens each) with every `--image-every`-th one carrying a picture in
its state (a 448 x 448 PNG as a data URI, the size benchmarks/omni_shape.py times; ~196 picture tokens beside the
text). Each picture differs (seeded), so the server decodes and encodes every one.

    python benchmarks/long_suite.py --tokens 512 --n 64 --out s512.jsonl
    python benchmarks/mixed_suite.py --suite s512.jsonl --image-every 2 --out mixed.jsonl
    quantbench serve --backend int4 --shape qwen3-omni-30b-a3b &
    quantbench load --endpoint http://127.0.0.1:8000 --suite mixed.jsonl --concurrency 1,8
"""

from __future__ import annotations

import argparse
import json

from quantbench.server.warm import block_picture


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="a text suite (JSONL of records)")
    ap.add_argument("--image-every", type=int, default=2, help="every N-th record carries a picture (2: half)")
    ap.add_argument("--side", type=int, default=448)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.image_every < 1:
        ap.error("--image-every: 1 or more")
    n = pictures = 0
    with open(args.suite) as src, open(args.out, "w") as out:
        for i, line in enumerate(src):
            record = json.loads(line)
            if i % args.image_every == 0:
                record["id"] = f"{record['id']}-image"
                record["request"]["state"]["camera"] = {"type": "image", "data": block_picture(args.side, i)}
                pictures += 1
            out.write(json.dumps(record) + "\n")
            n += 1
    print(f"wrote {n} records to {args.out}, {pictures} with a {args.side} x {args.side} picture")


if __name__ == "__main__":
    main()
