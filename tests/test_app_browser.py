"""The demo app in a real browser: Debian's chromium driven by playwright, against the whole stack
(template server process with an access log → device agent subprocess via device_bridge → app).

Packs: fs-astronaut (every format, max rank 32: a copy of the session's ``fs_packs``) and a quick
mb-coffee (SAKURA + FP16 only, plain SVD, rank 8) for the text edit; built once and kept in pytest's
cache folder, keyed by the sources that shape them. Screenshots go to artifacts/screenshots/; set
SAKURA_UPDATE_SCREENSHOTS=1 to also refresh docs/screenshots/edit-page.png (the README's mid-run picture).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
SHOTS = ROOT / "artifacts" / "screenshots"
DOC_SHOT = ROOT / "docs" / "screenshots" / "edit-page.png"
FS, MB = "fs-astronaut", "mb-coffee"
EDIT_TIMEOUT_MS = 240_000

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="browser tests need Debian's chromium at /usr/bin/chromium "
                       "(apt-get install -y chromium)"),
    pytest.mark.timeout(900),
]


# -------------------------------------------------------------------------------------------- packs
def _source_key() -> str:
    h = hashlib.sha256()
    for rel in ("sakura/offline", "sakura/model", "sakura/catalog", "sakura/kvcache.py", "sakura/editing.py",
                "sakura/weights", "templates_catalog"):
        p = ROOT / rel
        for f in sorted(p.rglob("*") if p.is_dir() else [p]):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(f.relative_to(ROOT).as_posix().encode())
                h.update(f.read_bytes() if f.stat().st_size < 4 << 20 else str(f.stat().st_size).encode())
    return h.hexdigest()[:16]


def _build(out: Path, fs_packs: Path) -> None:
    import torch

    from sakura.catalog import load_catalog
    from sakura.editing import model_for
    from sakura.formats import file_id
    from sakura.formats.fp16 import write_fp16
    from sakura.offline.builder import capture_request
    from sakura.offline.compress import pack_cache

    cat = load_catalog()
    out.mkdir(parents=True)
    for f in fs_packs.glob(f"{FS}.*"):  # the session's build of fs-astronaut (conftest: every format, max rank 32)
        shutil.copy2(f, out / f.name)
    mb = cat.get(MB)
    model = model_for(mb)
    cache = model.capture(capture_request(mb, model)).to(torch.float16)
    ids = {"model_id": model.model_id, "template_id": mb.id}
    pack_cache(out / f"{file_id(mb.id, 'sakura')}.pack", cache, None, q=0.0, max_rank=8, shard_size=2, **ids)
    write_fp16(out / f"{file_id(mb.id, 'fp16')}.pack", cache, shard_size=2, **ids)


@pytest.fixture(scope="session")
def app_packs(request, tmp_path_factory) -> Path:
    try:
        root = Path(request.config.cache.mkdir("sakura-app-packs"))
    except (AttributeError, OSError):  # cache provider disabled: build for this session only
        root = tmp_path_factory.mktemp("app-packs")
    out = root / _source_key()
    if not (out / "complete").is_file():
        for old in root.iterdir():  # packs of older sources
            shutil.rmtree(old, ignore_errors=True)
        tmp = root / f"tmp-{uuid.uuid4().hex[:8]}"
        _build(tmp, request.getfixturevalue("fs_packs")[0])
        (tmp / "complete").write_text("ok")
        tmp.rename(out)
    return out


# -------------------------------------------------------------------------------------------- stack
@dataclass
class Stack:
    url: str
    data: Path
    access_log: Path
    bridge: object


@pytest.fixture(scope="module")
def stack(app_packs, tmp_path_factory):
    from app.cli import start_app
    from app.server import create_app
    from device_bridge import connect
    from sakura.eval.explorer import Explorer
    from sakura.server.run import start_server

    data = tmp_path_factory.mktemp("app-data")
    log = data / "template-server-access.log"
    server = start_server(app_packs, process=True, access_log=log)
    bridge = None
    running = None
    try:
        bridge = connect("subprocess", server_url=server.url)
        bridge.warmup(FS)  # model load + compute calibration, once, outside the timed UI steps
        explorer = Explorer(app_packs, data / "explorer", budgets=2, baseline_levels=1)
        app = create_app(bridge, data_dir=data, explorer=explorer)
        running = start_app(app)
        yield Stack(running.url, data, log, bridge)
    finally:
        if running is not None:
            running.stop()
        if bridge is not None:
            bridge.close()
        server.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, stack, request):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(stack.url)
    pg.wait_for_selector("#run-btn")
    yield pg
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        pg.screenshot(path=str(SHOTS / f"{request.node.name}.png"), full_page=True)
    finally:
        ctx.close()


# ------------------------------------------------------------------------------------------ helpers
def _status(pg, css: str = "#status") -> str:
    return pg.inner_text(css)


def _wait_status(pg, kind: str, css: str = "#status", timeout: int = 60_000) -> str:
    pg.wait_for_selector(f"{css} .sk-{kind}", timeout=timeout)
    return _status(pg, css)


def _wait_text(pg, text: str, css: str = "#status", timeout: int = 60_000) -> str:
    """Wait until the element's text contains ``text`` (messages replace each other in place)."""
    pg.wait_for_function("([css, text]) => (document.querySelector(css)?.innerText || '').includes(text)",
                         arg=[css, text], timeout=timeout)
    return _status(pg, css)


def _upload(pg, css: str, path: Path) -> None:
    pg.set_input_files(f"{css} input[type=file]", str(path))


def _face(tmp_path: Path, marker: str) -> Path:
    """A face photo (a crop of the astronaut portrait) saved under a unique name."""
    from PIL import Image
    from skimage import data

    p = tmp_path / f"face-{marker}.jpg"
    Image.fromarray(data.astronaut()[20:240, 130:340]).save(p, quality=92)
    return p


def _fixed_link(pg, mbps: int = 2000) -> None:
    pg.get_by_role("radio", name="Fixed rate").check()
    pg.fill("#fixed-mbps input", str(mbps))


def _wait_done(pg, on_progress=None) -> str:
    deadline = time.monotonic() + EDIT_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        st = _status(pg)
        if on_progress:
            on_progress(st)
        if st.startswith("Done") and not pg.locator("#status .sk-run").count():  # (not the output's early Done)
            return st
        if pg.locator("#status .sk-error, #status .sk-warn").count():
            return _status(pg)  # (read again: the status may have changed since ``st``, e.g. to a noted "Done")
        time.sleep(0.15)
    raise AssertionError(f"the edit did not finish; status: {_status(pg)!r}")


SESSION: dict = {}  # what the privacy test checks the access log against


# -------------------------------------------------------------------------------------------- tests
def test_page_loads(page):
    assert "SAKURA" in page.inner_text("#sk-header")
    for task in ("fs", "vton", "mb"):
        assert page.locator(f"#gallery-{task} .thumbnail-item").count() >= 2
    assert "fs-astronaut" in page.inner_text("#template-info")
    for tab in ("Edit", "Quality explorer", "User study"):
        assert page.get_by_role("tab", name=tab).is_visible()
    assert page.evaluate("() => fetch('/sakura-static/app.css').then(r => r.status)") == 200


def test_bad_inputs_give_friendly_messages(page, tmp_path):
    from PIL import Image

    # run with no photo
    page.click("#run-btn")
    _wait_text(page, "upload a face photo")
    # a text file named like an image
    notimg = tmp_path / "holiday.png"
    notimg.write_text("this is not an image")
    _upload(page, "#photo-upload", notimg)
    _wait_text(page, "not an image we can read")
    # a huge image (81 megapixels; tiny as a file)
    huge = tmp_path / "huge.png"
    Image.new("L", (9000, 9000)).save(huge)
    page.wait_for_selector("#photo-upload input[type=file]", state="attached")
    _upload(page, "#photo-upload", huge)
    _wait_text(page, "the limit is 4096 px per side")
    # a trace file with garbage
    page.get_by_role("radio", name="Upload a trace file").check()
    garbage = tmp_path / "trace.csv"
    garbage.write_text("time_s,mbps\n0,fast\n1,slow\n")
    page.wait_for_selector("#trace-upload input[type=file]", state="attached")
    _upload(page, "#trace-upload", garbage)
    assert "non-numeric" in _wait_text(page, "trace file cannot be used")
    # a good photo, then a bad fixed rate and a bad trace start
    page.wait_for_selector("#photo-upload input[type=file]", state="attached")
    _upload(page, "#photo-upload", _face(tmp_path, "ok"))
    _wait_text(page, "Photo ready")
    _fixed_link(page, 0)
    page.click("#run-btn")
    _wait_text(page, "fixed link rate must be")
    _fixed_link(page, 100)
    page.fill("#trace-start input, #trace-start textarea", "soon")
    page.click("#run-btn")
    _wait_text(page, "trace start must be a number")
    # text edit with an empty prompt (picked from the gallery)
    page.locator("#gallery-mb .thumbnail-item").first.click()
    _wait_text(page, "mb-", "#template-info")
    page.click("#run-btn")
    _wait_text(page, "prompt is empty")
    assert page.locator("#status .sk-warn").count() == 1
    assert "Traceback" not in page.content()
    # and the app keeps working: back to face swap, the photo uploaded before the detour is kept (#31 item 7)
    page.locator("#gallery-fs .thumbnail-item").first.click()
    _wait_text(page, "fs-astronaut", "#template-info")
    _wait_text(page, "your photo is kept")


# SAKURA finished on the stream; on a busy machine a rebuild may miss its step and reuse the previous
# step's K/V (a designed fallback, named in the status), but never go local on a fast fixed link.
SAKURA_DONE = re.compile(r"Done: SAKURA( \(reused \d+ shards?\))? finished")


def test_fs_edit_runs_to_completion(page, tmp_path):
    marker = uuid.uuid4().hex[:12]
    face = _face(tmp_path, marker)
    SESSION["photo"] = face.read_bytes()
    SESSION["photo_name"] = face.name
    _upload(page, "#photo-upload", face)
    _wait_status(page, "ok")
    _fixed_link(page, 2000)
    page.uncheck("#use-prefetch input")  # stream it all (an earlier pick may have prefetched this template)
    page.click("#run-btn")
    mid: dict = {}

    def snap(st: str) -> None:
        m = re.search(r"shards executed (\d+)/(\d+)", st)
        if m and not mid and 1 <= int(m.group(1)) < int(m.group(2)):
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "edit-page-midrun.png"))
            mid["shot"] = st

    t0 = time.monotonic()
    final = _wait_done(page, snap)
    assert SAKURA_DONE.match(final), final
    SESSION["edit_s"] = time.monotonic() - t0
    # the timeline: bandwidth line and shard bars are drawn
    assert page.locator("#timeline .scatterlayer .trace").count() >= 1
    assert page.locator("#timeline .barlayer .point").count() >= 16
    assert "finished" in page.inner_text("#timeline")
    # both images and the difference map
    for css in ("#out-image", "#ref-image", "#diff-image"):
        page.wait_for_selector(f"{css} img")
    cards = page.inner_text("#metrics").lower()  # the card titles are upper-cased by CSS
    assert "psnr" in cards and "ssim" in cards and "bytes sent" in cards and "of the" in cards
    priv = page.inner_text("#privacy-panel")
    assert "Your photo never left the device" in priv and "fs-astronaut" in priv
    assert page.inner_text("#privacy-table").count("fs-astronaut") >= 3  # one row per request
    assert page.locator("#latency .barlayer .point").count() >= 2


def test_text_edit_on_an_uploaded_trace_keeps_prompt_and_trace_on_device(page, tmp_path):
    prompt = f"paint the cup cobalt blue {uuid.uuid4().hex[:10]}"
    SESSION["prompt"] = prompt
    page.locator("#gallery-mb .thumbnail-item").first.click()
    page.wait_for_selector("#prompt textarea")
    page.fill("#prompt textarea", prompt)
    trace = tmp_path / f"mylink-{uuid.uuid4().hex[:8]}.csv"
    trace.write_text("time_s,mbps\n0,1500\n1,2500\n2,2000\n")
    SESSION["trace_name"] = trace.name
    page.get_by_role("radio", name="Upload a trace file").check()
    page.wait_for_selector("#trace-upload input[type=file]", state="attached")
    _upload(page, "#trace-upload", trace)
    assert "median" in _wait_text(page, "Trace ready")
    page.locator("#regime input[type=checkbox]").uncheck()  # the file's own rates, unscaled
    page.click("#run-btn")
    final = _wait_done(page)
    assert final.startswith("Done"), final
    assert "Your instruction never left the device" in page.inner_text("#privacy-panel")
    assert "2500" in page.inner_text("#timeline") or page.locator("#timeline .scatterlayer .trace").count() >= 1


def test_template_server_log_holds_no_user_data(stack):
    if not {"photo", "prompt", "trace_name"} <= SESSION.keys():
        pytest.skip("needs the fs and text edits above to have run")
    raw = stack.access_log.read_bytes()
    assert raw, "the template server logged nothing"
    photo = SESSION["photo"]
    needles = {photo[i:i + 12] for i in range(0, len(photo) - 12, 61)}
    b64 = base64.b64encode(photo)
    needles |= {b64[i:i + 16] for i in range(0, len(b64) - 16, 97)}
    prompt = SESSION["prompt"]
    needles |= {prompt.encode(), prompt.split()[-1].encode(), json.dumps(prompt).encode(),
                prompt.replace(" ", "%20").encode(), prompt.replace(" ", "+").encode(),
                SESSION["photo_name"].encode(), Path(SESSION["photo_name"]).stem.split("-")[-1].encode(),
                SESSION["trace_name"].encode(), Path(SESSION["trace_name"]).stem.encode()}
    leaked = [n for n in needles if n in raw]
    assert not leaked, f"user data in the template server's log: {leaked[:3]}"
    # and what is there is only template files, byte ranges and link emulation
    files = re.compile(rf"^/(packs|ws)/({FS}|{MB})(\.fp16|\.intq|\.cachegen)?(/header)?$")
    for line in raw.decode().splitlines():
        rec = json.loads(line)
        path = rec["path"].split("?")[0]
        assert files.match(path) or path in ("/templates", "/healthz"), rec
        msg = rec.get("message")
        if msg:
            assert set(json.loads(msg)) <= {"id", "ranges", "rate"}, rec


def test_study_tab_points_to_its_own_app(page):
    """The study runs as ``sakura study serve``: the demo's pages hold no vote, result or export of it."""
    page.get_by_role("tab", name="User study").click()
    assert "sakura study serve" in page.inner_text("#study-note")
    assert not page.query_selector("#study-table, #study-export, #study-pid, #vote-similar")


def test_quality_explorer(page):
    page.get_by_role("tab", name="Quality explorer").click()
    page.click("#ex-load")
    page.wait_for_selector("#ex-status .sk-ok", timeout=EDIT_TIMEOUT_MS)
    assert page.locator("#ex-plot .scatterlayer .trace").count() == 3
    page.locator("#ex-budget input[type=range]").fill("100")
    page.wait_for_function("() => document.querySelector('#ex-budget-text').innerText.includes('100.0% of the')")
    table = page.inner_text("#ex-table")
    assert "SAKURA" in table and "IntQ" in table and "CacheGen" in table and "nothing fits" not in table
    page.locator("#ex-budget input[type=range]").fill("0")
    page.wait_for_function("() => document.querySelector('#ex-table').innerText.includes('nothing fits')")


@pytest.mark.skipif(not os.environ.get("SAKURA_UPDATE_SCREENSHOTS"), reason="set SAKURA_UPDATE_SCREENSHOTS=1 to "
                    "refresh docs/screenshots/edit-page.png")
def test_readme_screenshot(page, tmp_path):
    """The README's picture: SAKURA mid-run on the mixed 4G+5G trace in the paper's regime."""
    _upload(page, "#photo-upload", _face(tmp_path, "readme"))
    _wait_text(page, "Photo ready")
    page.get_by_role("radio", name="4G + 5G (mixed)").check()
    page.fill("#trace-start input, #trace-start textarea", "40")  # inside a 4G segment
    best = None

    def progress(st: str):
        m = re.search(r"shards executed (\d+)/(\d+)", st)
        return (int(m.group(1)), int(m.group(2))) if m else None

    page.set_viewport_size({"width": 1400, "height": 2060})  # inputs, status and timeline in one picture
    for attempt in range(12):  # an edit lasts about a second here: try again if no frame caught it mid-way
        first = 5 if attempt < 4 else 2  # prefer a frame with a few shards done
        page.click("#run-btn")
        page.wait_for_selector("#status .sk-run", timeout=EDIT_TIMEOUT_MS)
        page.evaluate("() => window.scrollTo(0, 0)")
        deadline = time.monotonic() + EDIT_TIMEOUT_MS / 1000
        while time.monotonic() < deadline:
            st = _status(page)  # cheap: poll the text, take a picture only once shards are moving
            if st.startswith("Done") or page.locator("#status .sk-error, #status .sk-warn").count():
                break
            p = progress(st)
            if p and first <= p[0] < p[1]:
                png = page.screenshot()
                after = progress(_status(page))
                if after and after[0] < after[1]:  # still running after the shot: the shot is mid-run
                    best = png
                    break
            time.sleep(0.02)
        if best is not None:
            break
    assert best is not None, "never caught the edit mid-run"
    DOC_SHOT.parent.mkdir(parents=True, exist_ok=True)
    DOC_SHOT.write_bytes(best)


def test_picking_a_template_starts_its_download(page, tmp_path):
    """Picking a template (not the photo, not the prompt) starts the pack downloading on the device; the
    edit's timeline then says how much was already there at Run. (Last: the device keeps what it
    prefetched, so later edits of the template would stream less.)"""
    _fixed_link(page, 50)
    page.locator("#gallery-mb .thumbnail-item").first.click()
    _wait_text(page, "mb-", "#template-info")
    page.locator("#gallery-fs .thumbnail-item").first.click()
    assert "downloading meanwhile" in _wait_text(page, "downloading meanwhile")
    page.wait_for_selector("#photo-upload input[type=file]", state="attached")
    _upload(page, "#photo-upload", _face(tmp_path, "prefetch"))
    _wait_text(page, "Photo ready")
    time.sleep(2.0)  # the person's think time: the pack keeps arriving
    page.click("#run-btn")
    final = _wait_done(page)
    assert SAKURA_DONE.match(final), final
    assert "already on the device at Run" in page.inner_text("#timeline")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "prefetch-timeline.png"), full_page=True)
