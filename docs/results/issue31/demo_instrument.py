"""The demo as an instrument (#31 items 3–4), driven in Chromium as a user would, on `sakura demo` itself.

    python docs/results/issue31/demo_instrument.py --packs PACKS [--build vton-astronaut] [--out docs/results/issue31]

PACKS holds fs-astronaut's packs (``sakura build --templates fs-astronaut --out PACKS``); ``--build`` names a
template whose packs are missing, so that it builds behind the page the whole time (paused during each run).
A fresh calibration cache (``SAKURA_CACHE_DIR`` in a temporary folder) makes this a first start. Measured:

1. first edit: from the moment fs-astronaut is calibrated behind the page, Run → Done wall time for a SAKURA
   edit, against the edit's own time (the agent's, from its result) — target ≤ 2×;
2. Compare all at a fixed 3 Mbps: Run → Done wall time (target ≤ 60 s), screenshot;
3. Compare all at a fixed 30 Mbps with the build behind the page: every row's latency against the oracle's,
   the rows' clocks and notes, screenshot.
Writes ``demo_instrument.json`` and the screenshots to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "results" / "issue28"))
from demo_screenshots import CHROMIUM_ARGS, fixed_link, give_photo, pick, references  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pg, js: str, timeout_s: float, arg=None) -> None:
    pg.wait_for_function(js, arg=arg, timeout=timeout_s * 1000)


LAST: dict = {}  # the last run's page events
STATUS = "(document.querySelector('#status .sk-status')?.innerText || '')"  # (not the progress overlay's timer)


def run_and_time(pg, timeout_s: float = 600) -> tuple[float, str]:
    """Click Run; wall seconds until the status says Done with the whole result on the page (the old status
    is blanked first: the page only writes a new one). The seconds until the output was on the page (its
    early Done, before the FP16 reference) are in ``LAST["output_s"]``."""
    pg.evaluate("() => { const s = document.querySelector('#status .sk-status'); if (s) s.textContent = ''; }")
    pg.evaluate("""() => { window.__log = []; const t0 = performance.now();
        const note = (what) => window.__log.push([Math.round(performance.now() - t0), what]);
        const obs = new MutationObserver(() => {
            const s = document.querySelector('#status .sk-status')?.innerText || '';
            if (window.__last !== s) { window.__last = s; note('status: ' + s.slice(0, 60)); }
            const img = document.querySelector('#out-image img')?.src || '';
            if (img && window.__img !== img) { window.__img = img; note('output image'); }
        });
        obs.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
        window.__obs = obs; }""")
    t0 = time.monotonic()
    pg.click("#run-btn")
    wait_for(pg, f"() => ({STATUS}.startsWith('Done') && !document.querySelector('#status .sk-run'))"
                 " || document.querySelector('#status .sk-error')", timeout_s)
    wall = time.monotonic() - t0
    log = pg.evaluate("() => { window.__obs.disconnect(); return window.__log; }")
    print("page events (ms after Run):", *(f"{t:>6} {w}" for t, w in log), sep="\n  ", flush=True)
    LAST["output_s"] = next((t / 1000 for t, w in log if w == "output image"), None)
    LAST["page_events_ms"] = log
    # every picture loaded before the screenshot (the gallery's are lazy: ask for them now)
    pg.evaluate("() => { for (const i of document.images) i.loading = 'eager'; }")
    try:
        wait_for(pg, "() => [...document.images].every(i => i.complete)", 30)
    except Exception:  # noqa: BLE001 - a picture still loading is not a result
        print("warning: some pictures had not loaded by the screenshot", flush=True)
    return wall, pg.evaluate(f"() => {STATUS}")


def edit_times(wall: float, own: float) -> dict:
    """Run → Done and Run → the output on the page, against the edit's own latency."""
    out = LAST.get("output_s")
    return {"run_to_done_s": round(wall, 3), "edit_latency_s": own, "ratio": round(wall / own, 2),
            "run_to_output_s": out, "output_ratio": round(out / own, 2) if out else None,
            "page_events_ms": LAST.get("page_events_ms")}


def compare_table(pg) -> list[dict]:
    """The comparison table's rows as dicts (header → cell), read from the rendered table."""
    grid = pg.evaluate("""() => [...document.querySelectorAll('#compare-table [role=row]')].map(
        tr => [...tr.querySelectorAll('[role=gridcell], [role=columnheader], td')].map(c => c.innerText.trim()))""")
    grid = [r for r in grid if any(r)]
    headers = [h.replace("\n", " ") for h in grid[0]] if grid else []
    return [dict(zip(headers, r)) for r in grid[1:]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", required=True)
    ap.add_argument("--build", default="vton-astronaut", help="a template built behind the page meanwhile")
    ap.add_argument("--out", default=str(Path(__file__).parent))
    ap.add_argument("--first-edit-only", action="store_true", help="measure the first edit (and --repeats more), no"
                    " Compare all")
    ap.add_argument("--first-edit-mbps", type=float, default=0,
                    help="the first edit's fixed link (0: the page's default link, as after `make demo`)")
    ap.add_argument("--repeats", type=int, default=0, help="edits after the first, each timed the same way")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="sakura-31-"))
    packs = work / "packs"
    shutil.copytree(args.packs, packs)
    refs = references(work / "refs")
    port = free_port()
    env = {**os.environ, "SAKURA_CACHE_DIR": str(work / "cache")}
    cmd = [str(ROOT / ".venv" / "bin" / "sakura"), "demo", "--port", str(port), "--packs", str(packs),
           "--templates", ",".join(["fs-astronaut"] + ([args.build] if args.build else [])),
           "--data", str(work / "data")]
    t_start = time.monotonic()
    demo = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    report: dict = {"command": " ".join(cmd[1:]), "load_average_at_start": os.getloadavg()}
    try:
        for line in demo.stdout:
            print("demo:", line.rstrip(), flush=True)
            if "demo running at" in line:
                break
        report["page_served_s"] = round(time.monotonic() - t_start, 1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            pg = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
            pg.set_default_timeout(120_000)
            pg.goto(f"http://127.0.0.1:{port}/")
            pg.wait_for_selector("#run-btn")
            pick(pg, "fs", "fs-astronaut")
            give_photo(pg, refs["hopper"])
            wait_for(pg, "() => (document.querySelector('#status')?.innerText || '').includes('Photo ready')", 60)
            # 1. the first edit, once calibrated behind the page
            wait_for(pg, "() => /calibrated for [1-9]/.test(document.querySelector('#build-status')?.innerText"
                         " || '') || !(document.querySelector('#template-info')?.innerText || '')"
                         ".includes('calibrat')", 600)
            report["calibrated_after_s"] = round(time.monotonic() - t_start, 1)
            if args.first_edit_mbps:
                fixed_link(pg, args.first_edit_mbps)
            pg.get_by_role("radio", name="SAKURA").first.check()
            wall, status = run_and_time(pg)
            own = float(re.search(r"finished in ([\d.]+) s", status).group(1))
            report["first_edit"] = {**edit_times(wall, own), "status": status}
            pg.screenshot(path=str(out / "first-edit.png"), full_page=True)
            for _ in range(args.repeats):
                wall, status = run_and_time(pg)
                own = float(re.search(r"finished in ([\d.]+) s", status).group(1))
                report.setdefault("later_edits", []).append(edit_times(wall, own))
                print("later edit", report["later_edits"][-1], flush=True)
            if args.first_edit_only:
                browser.close()
                return
            # 2. Compare all at 3 Mbps: SAKURA on the real clock, the baselines on the simulated one
            for mbps, name in ((3, "compare-all-3mbps"), (30, "compare-all-30mbps-building")):
                fixed_link(pg, mbps)
                pg.get_by_role("radio", name="Compare all").check()
                wall, status = run_and_time(pg, 900)
                rows = compare_table(pg)
                oracle = next((float(r["latency s"]) for r in rows if r["system"].startswith("Oracle")), None)
                report[name] = {"run_to_done_s": round(wall, 1), "status": status, "rows": rows,
                                "below_oracle_without_note": [r["system"] for r in rows if oracle is not None
                                                              and float(r["latency s"]) < oracle
                                                              and not r.get("note")],
                                "build_status": pg.inner_text("#build-status")}
                pg.screenshot(path=str(out / f"{name}.png"), full_page=True)
                print(name, json.dumps(report[name], indent=1), flush=True)
            browser.close()
    finally:
        demo.terminate()
        try:
            demo.wait(30)
        except subprocess.TimeoutExpired:
            demo.kill()
        report["load_average_at_end"] = os.getloadavg()
        name = "first_edit.json" if args.first_edit_only else "demo_instrument.json"
        (out / name).write_text(json.dumps(report, indent=1))
        print(json.dumps({k: v for k, v in report.items() if not k.startswith("compare")}, indent=1))


if __name__ == "__main__":
    main()
