"""The study's pool from real packs: the preparer runs behind a served participants' page, picks the template
up when its packs are published (no restart), and records per pair its system, budget level, bytes, masked
PSNR and SSIM from the quality explorer's real edits; then the participant's page in a browser."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from app.cli import start_app
from app.study import Design, StudyStore
from app.study_pool import PoolConfig, PoolPreparer, TemplateInfo, choose_points
from app.study_web import Limits, participant_app

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
SHOT = ROOT / "docs" / "screenshots" / "study-participant.png"


def _wrong(template_id: str, size: int) -> Image.Image:
    from skimage import data

    return Image.fromarray(data.coffee()).resize((size, size))


@pytest.fixture(scope="module")
def prepared(fs_packs, tmp_path_factory):
    """A study whose pool is prepared while its page is served: packs arrive after start-up."""
    from sakura.eval.explorer import Explorer

    packs_src, template = fs_packs
    root = tmp_path_factory.mktemp("study-pool")
    packs = root / "packs"
    packs.mkdir()
    store = StudyStore(root / "study", Design(per_cell=1, controls=2), seed="pool")
    explorer = Explorer(packs, root / "explorer", budgets=2, baseline_levels=2)
    info = TemplateInfo(template.id, template.task, len(template.eval_requests))
    prep = PoolPreparer(store, explorer, [info], _wrong, PoolConfig(requests=1, budgets=2, max_fraction=0.35),
                        poll_s=0.2)
    with start_app(participant_app(store, Limits(min_vote_interval_s=0.0)), port=0) as srv:
        c = httpx.Client(base_url=srv.url, follow_redirects=True, timeout=60)
        c.post("/consent").raise_for_status()
        prep.start()
        before = c.get("/api/next").json()
        for f in packs_src.glob(f"{template.id}.*"):  # the build publishes while the page is up
            shutil.copy2(f, packs / f.name)
        assert prep.wait(300), prep.status()
        after = c.get("/api/next").json()
        yield store, prep, before, after, srv.url, c
        c.close()
        prep.stop()


def test_the_pool_fills_behind_the_page_as_packs_are_published(prepared):
    store, prep, before, after, _, _ = prepared
    assert before["state"] == "preparing"
    assert after["state"] == "ask" and after["total"] >= 4
    st = prep.status()
    assert st.done == ["fs-astronaut#0"] and not st.errors and not st.waiting


def test_each_pair_records_system_budget_bytes_and_quality(prepared):
    store = prepared[0]
    pool = store.pool()
    tests = [c for c in pool if c.kind == "test"]
    assert {c.system for c in tests} == {"sakura", "intq", "cachegen"}
    for s in ("sakura", "intq", "cachegen"):
        mine = sorted((c for c in tests if c.system == s), key=lambda c: c.budget)
        assert [c.budget for c in mine] == list(range(len(mine))) and 1 <= len(mine) <= 2
        assert [c.bytes for c in mine] == sorted(c.bytes for c in mine) and len({c.bytes for c in mine}) == len(mine)
        assert mine[0].fraction < 0.35 and all(0 < c.bytes < c.fp16_bytes for c in mine)
        for c in mine:
            assert 5 < c.psnr_masked <= 100 and 0 < c.ssim <= 1 and c.psnr > c.psnr_masked - 1
            assert c.template_id == "fs-astronaut" and c.workload == "fs" and c.request == 0
    # the pair's picture is the explorer's edit at that point, under a neutral name
    explorer_pts = prepared[1].explorer.frontier("fs-astronaut", 0)
    for c in tests:
        assert "sakura" not in c.image and store.image_path(c.image) is not None
        assert any(p["system"] == c.system and p["bytes"] == c.bytes for p in explorer_pts["points"])
    ident = next(c for c in pool if c.kind == "identical")
    wrong = next(c for c in pool if c.kind == "wrong")
    assert ident.image == ident.reference and wrong.image != wrong.reference
    a = np.asarray(Image.open(store.image_path(wrong.image)), np.float64)
    b = np.asarray(Image.open(store.image_path(wrong.reference)), np.float64)
    assert a.shape == b.shape and np.abs(a - b).mean() > 20
    # the zeroed-cache control: the template intact, the edited region visibly not the reference's
    zeroed = next(c for c in pool if c.kind == "zeroed")
    z = np.asarray(Image.open(store.image_path(zeroed.image)), np.float64)
    assert z.shape == b.shape and zeroed.psnr_masked < min(c.psnr_masked for c in tests) and zeroed.psnr_masked < 20
    assert zeroed.psnr > zeroed.psnr_masked  # outside the mask it is the template's own picture


def test_choose_points_spans_from_the_smallest_level_up_to_the_cap():
    pts = [{"system": "sakura", "bytes": b, "psnr_masked": 20 + b / 10, "config": str(b)}
           for b in (10, 20, 40, 80, 400)]
    data = {"points": pts, "fp16_bytes": 1000}
    got = choose_points(data, "sakura", PoolConfig(budgets=3, max_fraction=0.1))
    assert [p["bytes"] for p in got] == [10, 20, 80]  # targets 10, ~28, 80: best within each; 400 is over the cap
    every = choose_points(data, "sakura", PoolConfig(budgets=9, max_fraction=1.0))
    assert [p["bytes"] for p in every] == [10, 20, 40, 80, 400]
    only = {"points": [{"system": "sakura", "bytes": 500, "psnr_masked": 30, "config": "a"}], "fp16_bytes": 1000}
    assert [p["bytes"] for p in choose_points(only, "sakura", PoolConfig(max_fraction=0.1))] == [500]  # smallest kept


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_participant_page_in_a_browser(prepared):
    """Consent, then pairs from the pool: nothing on the page but the study; answers by click and by key."""
    from playwright.sync_api import sync_playwright

    store, _, _, _, url, _ = prepared
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            pg = b.new_context(viewport={"width": 1000, "height": 820}).new_page()
            pg.set_default_timeout(30_000)
            pg.goto(url)
            assert "Picture study" in pg.inner_text("h1") and "similar" in pg.inner_text("main")
            pg.click("#consent")
            pg.wait_for_selector("#similar:not([disabled])")
            status = pg.inner_text("#status")
            assert status.startswith("Pair 1 of ")
            for css in ("#left", "#right"):
                assert pg.eval_on_selector(css, "i => i.complete && i.naturalWidth > 0")
            text = pg.inner_text("body").lower()
            for word in ("sakura", "intq", "cachegen", "results", "export", "psnr", "fp16", "edit"):
                assert word not in text, word
            links = pg.eval_on_selector_all("a", "as => as.map(a => a.href)")
            assert links == []  # no way off the study
            pg.screenshot(path=str(SHOT), full_page=True)
            pg.click("#similar")
            pg.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Pair 2 of')")
            pg.wait_for_selector("#similar:not([disabled])")
            pg.keyboard.press("n")
            pg.wait_for_function("() => document.querySelector('#status').innerText.startsWith('Pair 3 of')")
            votes = store.votes()
            assert [v.similar for v in votes[-2:]] == [True, False]
        finally:
            b.close()
