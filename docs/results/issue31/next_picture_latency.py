"""Next-picture latency of the study's participant page, on a copy of a prepared pool (the study's own votes
are left alone).

    .venv/bin/python docs/results/issue31/next_picture_latency.py --data runs/study [--participants 3] [--browser]

HTTP: from sending an answer to having the next pair's JSON and both its PNGs (what the page waits for),
over loopback to a uvicorn server in this process. Browser (chromium): from the click on "Similar" to the
page showing the next pair (images loaded). Prints p50 / p90 / max and writes ``next_picture_latency.json``
beside this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from app.cli import start_app
from app.study import Design, StudyStore
from app.study_web import Limits, participant_app

HERE = Path(__file__).resolve().parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def _stats(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"n": len(xs), "p50_s": statistics.median(xs), "p90_s": xs[int(0.9 * (len(xs) - 1))], "max_s": xs[-1]}


def over_http(url: str, participants: int) -> list[float]:
    out = []
    for _ in range(participants):
        with httpx.Client(base_url=url, follow_redirects=True, timeout=30) as c:
            c.post("/consent").raise_for_status()
            d = c.get("/api/next").json()
            while d["state"] == "ask":
                t0 = time.perf_counter()
                c.post("/api/vote", json={"ticket": d["ticket"], "similar": True}).raise_for_status()
                d = c.get("/api/next").json()
                if d["state"] == "ask":
                    for src in (d["left"], d["right"]):
                        c.get(src).raise_for_status()
                    out.append(time.perf_counter() - t0)
    return out


def in_browser(url: str, pairs: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        pg = b.new_context(viewport={"width": 1000, "height": 820}).new_page()
        pg.goto(url)
        pg.click("#consent")
        for k in range(1, pairs + 1):
            pg.wait_for_selector("#similar:not([disabled])")
            if not pg.inner_text("#status").startswith(f"Pair {k} of"):
                break
            total = int(pg.inner_text("#status").split(" of ")[1])
            if k >= total:
                break
            t0 = time.perf_counter()
            pg.click("#similar")
            pg.wait_for_function(f"() => document.querySelector('#status').innerText.startsWith('Pair {k + 1} of') "
                                 "&& !document.querySelector('#similar').disabled", polling="raf")
            out.append(time.perf_counter() - t0)
        b.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="runs/study")
    ap.add_argument("--participants", type=int, default=3)
    ap.add_argument("--browser", action="store_true")
    a = ap.parse_args()
    src = StudyStore(a.data)
    with tempfile.TemporaryDirectory() as tmp:
        store = StudyStore(tmp, Design(per_cell=2, controls=6))
        n = store.import_pool(src)
        # no per-participant limit here: the script answers as fast as the page can show pairs
        with start_app(participant_app(store, Limits(min_vote_interval_s=0.0)), port=0) as srv:
            http = over_http(srv.url.rstrip("/"), a.participants)
            browser = in_browser(srv.url, 40) if a.browser else []
    res = {"pool_pairs": n, "http": _stats(http), "browser": _stats(browser) if browser else None}
    print(json.dumps(res, indent=1))
    (HERE / "next_picture_latency.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
