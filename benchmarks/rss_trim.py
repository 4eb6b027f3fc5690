"""Is the server's RSS growth a leak? The server's work in one process, then glibc's malloc_trim.

    python benchmarks/rss_trim.py 300        # 300 requests, trim, 150 more, trim (the embedded fixture, bf16)

The fixture's engine prepares each request on one thread and answers batches of 1-3 on another, as
`quantbench serve` does, over the seeded varied requests of benchmarks/serve_limits.py. RSS is printed every 50
requests, after gc.collect() and after malloc_trim(0): if trimming takes RSS back to the same floor each time,
the growth is freed memory malloc kept, not a leak. Linux with glibc only.
"""

from __future__ import annotations

import ctypes
import gc
import os
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_limits import rss_bytes, varied_request  # noqa: E402

from quantbench.protocol import parse_request  # noqa: E402
from quantbench.run.backend import get_backend  # noqa: E402
from quantbench.run.machine import detect  # noqa: E402
from quantbench.run.spec import RunSpec  # noqa: E402


def main(n: int) -> None:
    libc = ctypes.CDLL("libc.so.6")
    engine = get_backend("bf16").load(RunSpec(backend="bf16", device="cpu"), detect()).engine
    prepare, work = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    rng = random.Random(0)

    def rss() -> float:
        return round(rss_bytes(os.getpid()) / 1e9, 3)

    def phase(count: int) -> list[tuple[int, float]]:
        samples, done = [], 0
        while done < count:
            k = rng.randint(1, 3)
            requests = [parse_request(varied_request(rng)) for _ in range(k)]
            prepared = [prepare.submit(engine.prepare, r).result() for r in requests]
            work.submit(engine.forward_many, prepared).result()
            done += k
            if done % 50 < k:
                samples.append((done, rss()))
        return samples

    print("idle", rss(), flush=True)
    print("requests, RSS GB:", phase(n), flush=True)
    gc.collect()
    print("after gc.collect", rss(), flush=True)
    libc.malloc_trim(0)
    print("after malloc_trim", rss(), flush=True)
    print("more requests, RSS GB:", phase(n // 2), flush=True)
    libc.malloc_trim(0)
    print("after malloc_trim", rss(), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
