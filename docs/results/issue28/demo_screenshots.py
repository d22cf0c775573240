"""Drive the demo in Chromium as a user would and save the screenshots of issue #28 (docs/screenshots/).

    python docs/results/issue28/demo_screenshots.py --packs PACKS [--out docs/screenshots]

The stack is the demo's own: a template server process over PACKS (built first with
``sakura build --templates fs-astronaut,vton-astronaut,mb-coffee --out PACKS``), the device agent as a
subprocess, the Gradio app. Each shot: pick the template, give the photo (a held-out face, a garment) or
the instruction, fixed link, run SAKURA, wait for "Done", screenshot the page. With ``--compare-mbps R``,
then "Compare all" at that fixed rate, where the systems' cache levels differ visibly.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def references(folder: Path) -> dict[str, Path]:
    """Grace Hopper's face (held out of training), Groot's face (a face no training set holds: gradio's
    sample picture) and a navy uniform (a crop of Grace Hopper's portrait below the face)."""
    import matplotlib
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    hopper = np.asarray(Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"))
    import gradio

    groot = np.asarray(Image.open(Path(gradio.__file__).parent / "media_assets" / "images" / "groot.jpeg"))
    out = {"hopper": hopper[115:335, 140:380], "groot": groot[0:360, 290:630], "uniform": hopper[380:600, 40:470]}
    paths = {}
    for name, arr in out.items():
        paths[name] = folder / f"{name}.png"
        Image.fromarray(arr).save(paths[name])
    return paths


def wait_done(pg, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = pg.inner_text("#status")
        done = st.startswith("Done") and not pg.locator("#status .sk-run").count()  # (not the output's early Done)
        if done or pg.locator("#status .sk-error, #status .sk-warn").count():
            return st
        time.sleep(0.3)
    raise SystemExit(f"edit did not finish: {pg.inner_text('#status')!r}")


def pick(pg, task: str, template: str) -> None:
    gallery = pg.locator(f"#gallery-{task} .thumbnail-item")
    for i in range(gallery.count()):
        gallery.nth(i).click()
        try:
            pg.wait_for_function("t => (document.querySelector('#template-info')?.innerText || '').includes(t)",
                                 arg=template, timeout=20_000)  # (slow on a busy machine)
            return
        except Exception:  # noqa: BLE001 - another thumbnail of the task
            continue
    raise SystemExit(f"template {template} not in the {task} gallery")


def give_photo(pg, path: Path) -> None:
    """Upload ``path`` as the photo; a photo kept from an earlier pick is removed first (its ✕ button)."""
    if not pg.locator("#photo-upload input[type=file]").count():
        pg.evaluate("""() => { for (const b of document.querySelectorAll('#photo-upload button')) {
            const name = (b.getAttribute('aria-label') || '') + (b.title || '');
            if (/clear|remove/i.test(name)) { b.click(); return; } } }""")
        pg.wait_for_selector("#photo-upload input[type=file]", state="attached", timeout=20_000)
    pg.set_input_files("#photo-upload input[type=file]", str(path))


def fixed_link(pg, mbps: float) -> None:
    pg.get_by_role("radio", name="Fixed rate").check()
    pg.fill("#fixed-mbps input", str(mbps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", required=True)
    ap.add_argument("--out", default="docs/screenshots")
    ap.add_argument("--compare-mbps", type=float, default=None,
                    help="also run Compare all at this fixed rate (minutes: each baseline streams in real time)")
    ap.add_argument("--only", default=None, help="comma list of shot names (fs-hopper, fs-heldout-face, "
                                                   "vton-uniform, mb-red); default: all")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from app.cli import start_app
    from app.server import create_app
    from device_bridge import connect
    from sakura.eval.explorer import Explorer
    from sakura.server.run import start_server

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/sakura-shots")
    refs = references(work / "refs")
    server = start_server(args.packs, process=True)
    bridge = connect("subprocess", server_url=server.url)
    bridge.warmup("fs-astronaut")
    app = create_app(bridge, data_dir=work / "data", explorer=Explorer(args.packs, work / "explorer"))
    running = start_app(app)
    shots = [("fs", "fs-astronaut", refs["hopper"], None, "fs-hopper"),
             ("fs", "fs-astronaut", refs["groot"], None, "fs-heldout-face"),
             ("vton", "vton-astronaut", refs["uniform"], None, "vton-uniform"),
             ("mb", "mb-coffee", None, "make it red", "mb-red")]
    if args.only:
        shots = [s for s in shots if s[-1] in args.only.split(",")]
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            pg = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            pg.set_default_timeout(120_000)
            pg.goto(running.url)
            pg.wait_for_selector("#run-btn")
            for task, template, ref, prompt, name in shots:
                pick(pg, task, template)
                if ref is not None:
                    give_photo(pg, ref)
                    pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '')"
                                         ".includes('Photo ready')")
                else:
                    pg.fill("#prompt textarea", prompt)
                fixed_link(pg, 2000)
                pg.get_by_role("radio", name="SAKURA").first.check()
                pg.click("#run-btn")
                print(name, "→", wait_done(pg).splitlines()[0], flush=True)
                pg.screenshot(path=str(out / f"{name}.png"), full_page=True)
            if args.compare_mbps:  # every system on a slow link: the cache's level shows in the output
                pick(pg, "fs", "fs-astronaut")
                give_photo(pg, refs["hopper"])
                fixed_link(pg, args.compare_mbps)
                pg.get_by_role("radio", name="Compare all").check()
                pg.click("#run-btn")
                print("compare-all →", wait_done(pg, 900).splitlines()[0], flush=True)
                pg.screenshot(path=str(out / f"compare-all-{args.compare_mbps:g}mbps.png"), full_page=True)
            browser.close()
    finally:
        running.stop()
        bridge.close()
        server.stop()


if __name__ == "__main__":
    main()
