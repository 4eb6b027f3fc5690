"""Screenshots of every dashboard page over a real store (default: the repo's results.duckdb) into docs/screenshots.

    python benchmarks/screenshots.py [--db results.duckdb] [--gpu hopper] [--model 9af210da] [--since 2026-11-30]
                                     [--prefix ""]
                                     [--pages which-quant,latency,parity,runs] [--out docs/screenshots]

Drives Debian's chromium through Playwright against `streamlit run dashboard` on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote_plus

import httpx
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
PAGES = [("", "which-quant"), ("latency", "latency"), ("parity", "parity"), ("runs", "runs")]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=str(ROOT / "results.duckdb"))
    ap.add_argument("--gpu", default=None, help="GPU filter for the link (a family or a name)")
    ap.add_argument("--model", default=None, help="model filter for the link (its id or part of it)")
    ap.add_argument("--since", default=None, help="only runs made on or after this day (the sidebar's 'Runs since')")
    ap.add_argument("--prefix", default="", help="prefix of the file names")
    ap.add_argument("--pages", default=",".join(n for _, n in PAGES), help="which pages, comma-separated")
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "QUANTBENCH_DB": str(Path(args.db).resolve())}
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "dashboard", "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.set_default_timeout(60_000)
            for path, name in [p for p in PAGES if p[1] in args.pages.split(",")]:
                params = [f"{k}={quote_plus(v)}" for k, v in (("gpu", args.gpu), ("model", args.model),
                                                                      ("since", args.since)) if v]
                query = "?" + "&".join(params) if params else ""
                page.goto(f"{url}/{path}{query}")
                page.locator('[data-testid="stMain"] h1').first.wait_for(state="visible")
                page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')")
                page.wait_for_timeout(1500)
                height = page.evaluate('document.querySelector("[data-testid=stMain]").scrollHeight')
                page.set_viewport_size({"width": 1600, "height": max(1000, height)})
                page.wait_for_timeout(1500)
                page.screenshot(path=str(out / f"{args.prefix}{name}.png"))
                page.set_viewport_size({"width": 1600, "height": 1000})
                print(f"{out / (args.prefix + name)}.png")
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
