"""Drive `sakura demo` on an empty pack folder in Chromium: the template becomes usable before its level prices
are measured; an edit runs while they are (the device prices by the pack's own errors), another after they are
published in place (the device reads the header again). Screenshots of each.
Usage: python demo_pricing.py URL OUT_DIR [TIMEOUT_S] [PRICING_WAIT_S]"""

import re
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright
from skimage import data

url, out = sys.argv[1], Path(sys.argv[2])
timeout_s = float(sys.argv[3]) if len(sys.argv) > 3 else 3600
out.mkdir(parents=True, exist_ok=True)
face = Path(tempfile.mkdtemp()) / "face.jpg"
Image.fromarray(data.astronaut()[20:240, 130:340]).save(face, quality=92)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def text(pg, sel: str) -> str:
    return re.sub(r"\s+", " ", pg.inner_text(sel)).strip() if pg.locator(sel).count() else ""


def wait_for(pg, what, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if what():
            return True
        time.sleep(2)
    return False


def run_edit(pg, name: str) -> None:
    pg.click("#run-btn")
    time.sleep(2)
    wait_for(pg, lambda: text(pg, "#metrics")  # (the comparison with the FP16-reference output is the last step)
             or pg.locator("#status .sk-error, #status .sk-warn").count() > 0, 900)
    print(f"{name}: status:", text(pg, "#status")[:300])
    print(f"{name}: metrics:", text(pg, "#metrics")[:300])
    pg.screenshot(path=str(out / f"{name}.png"), full_page=False)


with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    pg = b.new_context(viewport={"width": 1400, "height": 1500}).new_page()
    pg.set_default_timeout(240_000)
    pg.goto(url)
    pg.wait_for_selector("#run-btn")
    t0 = time.monotonic()
    print("at start:", text(pg, "#build-status"), "|", text(pg, "#template-info")[:200])
    pg.screenshot(path=str(out / "building.png"))
    pricing = wait_for(pg, lambda: "measuring the level prices" in text(pg, "#build-status"),
                       float(sys.argv[4]) if len(sys.argv) > 4 else timeout_s)
    print(f"pricing after {time.monotonic() - t0:.0f} s:", text(pg, "#build-status"))
    pg.screenshot(path=str(out / "pricing.png"))
    pg.set_input_files("#photo-upload input[type=file]", str(face))
    pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '').includes('Photo ready')")
    if pricing:
        run_edit(pg, "edit-while-pricing")
        print("after the first edit:", text(pg, "#build-status"))
    priced = wait_for(pg, lambda: not text(pg, "#build-status"), timeout_s)
    print(f"priced after {time.monotonic() - t0:.0f} s:", priced, text(pg, "#template-info")[:200])
    run_edit(pg, "edit-priced")
    b.close()
