"""The screenshot of issue #33: a streamed face swap in the demo whose device runs the phone-style stack.

    python docs/results/issue33/phone_screenshot.py [--packs packs] [--out docs/screenshots/phone-stack.png]

Starts what ``sakura demo --executor executorch --reconstructor opencl`` starts (a template server process over
the packs, a device agent subprocess on ExecuTorch (XNNPACK) + OpenCL with its programs beside the packs, the
app), uploads Grace Hopper's portrait (matplotlib's sample data) to fs-astronaut on a fixed link, runs SAKURA and
saves the page once done (a fixed 30 Mbps link by default). Chromium from Debian (/usr/bin/chromium), driven
by playwright.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", default=str(ROOT / "packs"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots" / "phone-stack.png"))
    ap.add_argument("--template", default="fs-astronaut")
    ap.add_argument("--mbps", default="30", help="a fixed link rate (Mbps): the README screenshot's 30 Mbps")
    ap.add_argument("--calibration", default=None, help="the device's calibration file (e.g. the bench's)")
    a = ap.parse_args()

    import matplotlib
    from playwright.sync_api import sync_playwright

    from app.cli import describe_backends, start_app
    from app.server import create_app
    from device_bridge import connect
    from sakura.runtime.backends import programs_beside
    from sakura.server.run import start_server

    data = Path(tempfile.mkdtemp(prefix="sakura-phone-shot-"))
    face = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
    server = start_server(a.packs, process=True, access_log=data / "access.log")
    bridge = connect("subprocess", server_url=server.url, executor="executorch", reconstructor="opencl",
                     programs=programs_beside(a.packs), calibration_file=a.calibration)
    try:
        print(describe_backends(bridge), flush=True)
        t0 = time.time()
        print("warm-up:", bridge.warmup(a.template)["backends"], f"{time.time() - t0:.0f} s", flush=True)
        running = start_app(create_app(bridge, data_dir=data, offered=[a.template, "mb-coffee", "mb-sd-rocket"]))
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            pg = b.new_page(viewport={"width": 1400, "height": 1000})
            pg.set_default_timeout(120_000)
            pg.goto(running.url)
            pg.wait_for_selector("#run-btn")
            pg.set_input_files("#photo-upload input[type=file]", str(face))
            pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '').includes('Photo ready')")
            pg.get_by_role("radio", name="Fixed rate").check()
            pg.fill("#fixed-mbps input", a.mbps)
            pg.click("#run-btn")
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                st = pg.inner_text("#status")
                if st.startswith("Done") or pg.locator("#status .sk-error, #status .sk-warn").count():
                    break
                time.sleep(0.3)
            print("status:", pg.inner_text("#status"), flush=True)
            print("device panel:", pg.inner_text("#device-panel"), flush=True)
            time.sleep(1.5)
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=a.out, full_page=True)
            print("wrote", a.out)
            b.close()
        running.stop()
    finally:
        bridge.close()
        server.stop()


if __name__ == "__main__":
    main()
