"""Drive `sakura demo --link kernel` in Chromium: an fs edit over an uploaded step trace (regime off), screenshot of
the timeline (trace vs the monitor's estimate). Usage: python demo_browser.py URL OUT.png [RATE_FACTOR]"""

import re
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image
from playwright.sync_api import sync_playwright
from skimage import data

url, out = sys.argv[1], Path(sys.argv[2])
tmp = Path(tempfile.mkdtemp())
face = tmp / "face.jpg"
Image.fromarray(data.astronaut()[20:240, 130:340]).save(face, quality=92)
trace = tmp / "steps.csv"
factor = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
rates = [round(r * factor, 3) for r in [8, 2, 8, 1, 6, 3, 8, 0.5, 8, 4] * 3]
trace.write_text("time_s,mbps\n" + "".join(f"{0.5 * i:g},{r}\n" for i, r in enumerate(rates)))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    pg = b.new_context(viewport={"width": 1400, "height": 2060}).new_page()
    pg.set_default_timeout(240_000)
    pg.goto(url)
    pg.wait_for_selector("#run-btn")
    pg.set_input_files("#photo-upload input[type=file]", str(face))
    pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '').includes('Photo ready')")
    pg.get_by_role("radio", name="Upload a trace file").check()
    pg.wait_for_selector("#trace-upload input[type=file]", state="attached")
    pg.set_input_files("#trace-upload input[type=file]", str(trace))
    pg.wait_for_function("() => (document.querySelector('#status')?.innerText || '').includes('Trace ready')")
    pg.locator("#regime input[type=checkbox]").uncheck()
    pg.uncheck("#use-prefetch input")
    pg.click("#run-btn")
    pg.wait_for_selector("#status .sk-run")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        st = pg.inner_text("#status")
        if st.startswith("Done") or pg.locator("#status .sk-error, #status .sk-warn").count():
            break
        time.sleep(0.2)
    print("status:", re.sub(r"\s+", " ", pg.inner_text("#status"))[:300])
    pg.evaluate("() => document.querySelector('#timeline').scrollIntoView()")
    time.sleep(1)
    pg.locator("#timeline").screenshot(path=str(out))
    print("timeline:", re.sub(r"\s+", " ", pg.inner_text("#timeline"))[:400])
    b.close()
