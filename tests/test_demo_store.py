"""The demo on an S3 pack store (SeaweedFS, `sakura demo --packs s3://...`): the template server in store mode
(catalog, headers, presigned URLs), the device agent in its own process behind the websocket bridge reading pack
bytes straight from the store, the app's quality explorer and background builds on the same store.

Packs: the session's fs-astronaut (``fs_packs``, max rank 32) published into the store, so every image can be
compared with the one the local folder gives."""

from __future__ import annotations

import base64
import io
import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from device_bridge import Job, NetworkSpec, Photo, connect
from sakura.formats import FORMATS, file_id
from sakura.net.folder import FolderSource
from sakura.net.stores import open_store
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server

FS = "fs-astronaut"
LINK = NetworkSpec(trace="fixed:2000", start=0, scale=None, regime="none")


def stage_copy(packs, template_id, tmp_path):
    staged = tmp_path / f"staged-{template_id}"
    staged.mkdir()
    for name in FORMATS:
        shutil.copy(packs / f"{file_id(template_id, name)}.pack", staged)
    return staged


def pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


@pytest.fixture(scope="module")
def demo_store(s3, fs_packs, tmp_path_factory):
    """fs-astronaut published into a fresh prefix of the store; the template server in store mode over it
    (a process, with an access log) and a device agent process connected to it, as `sakura demo` starts them."""
    packs, tpl = fs_packs
    store = open_store(s3.url("demo"), create=True)
    store.publish(tpl.id, stage_copy(packs, tpl.id, tmp_path_factory.mktemp("stage")), "k" * 32)
    data = tmp_path_factory.mktemp("demo-data")
    log = data / "access.log"
    with start_server(store.url, process=True, access_log=log) as server:
        with connect("subprocess", server_url=server.url, calibration_file=data / "calibration.json") as bridge:
            yield SimpleNamespace(store=store, packs=packs, tpl=tpl, bridge=bridge, log=log, data=data)


def test_an_edit_in_the_demo_reads_the_store_and_matches_the_folder(demo_store, tmp_path):
    d = demo_store
    listed = {t["id"]: t for t in d.bridge.templates()}
    assert listed[FS]["available"] is True and listed["fs-grace-hopper"]["available"] is False
    from skimage import data

    face = tmp_path / "face.png"
    Image.fromarray(data.astronaut()[20:240, 130:340]).save(face)
    photo = Photo.from_file(face)
    events: list[dict] = []
    res = d.bridge.edit(Job(FS, system="fp16", photo=photo, network=LINK, prefetch=False), events.append)
    assert [e["type"] for e in events][-1] == "result" and not any(e["type"] == "error" for e in events)
    assert (
        res["pack_bytes_from"] == "store"
        and res["summary"]["bytes"] > 0
        and all(e["file_id"].startswith(FS) for e in res["sent_to_server"])
    )

    # the same edit on the same photo, its bytes read from the local folder (no link in between)
    with FolderSource(d.packs) as folder:
        session = DeviceRuntime(folder, calibration=CalibrationStore(d.data / "calibration.json")).session(
            d.tpl, "fp16", Network(LINK.link_trace, LINK.trace, 0.0, 1.0, "none"))
        req = session.request(prompt="", reference=photo.image())
        from_folder = session.run(req).image
        reference = session.reference(req)
    from device_bridge.media import png_b64

    np.testing.assert_array_equal(pixels(res["reference_png_b64"]), pixels(png_b64(reference)))
    assert not res["summary"].get("fallbacks"), res["summary"].get("fallbacks")  # the FP16 bytes were all used
    np.testing.assert_array_equal(pixels(res["image_png_b64"]), pixels(png_b64(from_folder)))

    sakura = d.bridge.edit(Job(FS, system="sakura", photo=photo, network=LINK, prefetch=False))
    # (on this fast link SAKURA's ladder may climb to its exact rung: the FP16 file's own bytes, never more)
    assert sakura["metrics"]["psnr"] > 25 and 0 < sakura["summary"]["bytes"] <= res["summary"]["bytes"]

    # the template server saw catalog, header and URL requests only: no pack byte went through it
    records = [json.loads(line) for line in d.log.read_text().splitlines()]
    paths = {r["path"].split("?")[0] for r in records}
    # (the FP16 edit read its file by URL; SAKURA's may too, when its ladder climbed to the exact rung everywhere)
    assert f"/packs/{FS}.fp16/url" in paths and f"/packs/{FS}.fp16/header" in paths and f"/packs/{FS}/header" in paths
    assert sakura["pack_bytes_from"] == "store"
    assert all(r["range"] is None for r in records)
    assert all(p in ("/healthz", "/templates") or p.endswith(("/url", "/header")) for p in paths), paths


def test_the_quality_explorer_reads_the_store_as_it_reads_the_folder(demo_store):
    from sakura.eval.explorer import Explorer

    d = demo_store
    from_store = Explorer(d.store.url, d.data / "explorer-s3", budgets=1, baseline_levels=1)
    from_folder = Explorer(d.packs, d.data / "explorer-folder", budgets=1, baseline_levels=1)
    assert from_store.available() == [FS]
    a, b = from_store.frontier(FS, 0), from_folder.frontier(FS, 0)
    # one budget per system, plus the points SAKURA's ladder adds above its allocated top (up to the FP16 size)
    assert a["points"] == b["points"] and {p["system"] for p in a["points"]} == {"sakura", "intq", "cachegen"}
    assert from_store.cached(FS, 0) == a  # keyed by the objects' hashes: found again


def test_missing_templates_are_built_into_the_store_and_published_whole(s3):
    from sakura.catalog import load_catalog
    from sakura.offline.build_queue import BuildQueue

    def fake_build(template, out_dir, *, progress, **settings):  # dummy bytes: publishing is what is tested
        names = FORMATS if template.id != "fs-grace-hopper" else ("sakura",)  # the second one misses formats
        for name in names:
            (out_dir / f"{file_id(template.id, name)}.pack").write_bytes(template.id.encode() * 4)

    def fake_measure(template, out_dir, model_path, progress):  # prices the kept build: a new SAKURA pack
        (out_dir / f"{file_id(template.id, 'sakura')}.pack").write_bytes(b"priced" * 4)
        assert store.read(FS, 0, 4) == b"fs-a"  # published unpriced first

    cat = load_catalog()
    store = open_store(s3.url("builds"), create=True)
    queue = BuildQueue([cat.get(FS), cat.get("fs-grace-hopper")], store, build=fake_build, measure=fake_measure)
    assert queue.start().wait(30)
    assert queue.status(FS) == "ready" and store.read(FS, 0, 6) == b"priced"  # then published again, priced
    assert store.read(file_id(FS, "fp16"), 0, 4) == b"fs-a"
    assert store.published_key(FS) == queue.settings.key(cat.get(FS))
    assert queue.status("fs-grace-hopper").startswith("failed: StoreError: the build of fs-grace-hopper wrote no")
    assert set(store.templates()) == {FS}  # nothing of the failed build is visible


def test_demo_on_a_store_it_cannot_use_says_why_in_one_line(capsys, tmp_path):
    import typer

    from app.cli import demo

    for packs, words in (("gs://bucket/x", "unknown pack store"), ("s3:///x", "bad store URL")):
        with pytest.raises(typer.Exit) as e:
            demo(host="127.0.0.1", port=0, packs=packs, device="inprocess", templates=None, data=tmp_path,
                 executor="eager", reconstructor="torch")
        assert e.value.exit_code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and words in err and err.count("\n") == 1
