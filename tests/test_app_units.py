"""The app's logic without a browser: timeline, uploads, inputs, explorer maths."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from app.edit_page import check_trace_upload, compare_rows, metrics_html, network_spec, privacy_html, privacy_rows
from app.explorer import at_budget, frontier_figure
from app.explorer_page import budget_of, slider_of
from app.images import UploadError, diff_heatmap, from_b64, png_b64
from app.timeline import latency_figure, timeline_figure
from device_bridge import EditProgress, EditRejected, NetworkSpec, Photo, TraceUpload
from sakura.eval.explorer import _spread


# ---------------------------------------------------------------------------------------- timeline
def _events():
    yield {"type": "accepted"}
    yield {"type": "plan", "shards": [[0, 0, 2], [0, 2, 4]], "units": [{"unit": 0, "shard": 0, "label": "a"},
                                                                       {"unit": 1, "shard": 1, "label": "b"}],
           "trace": {"t": [0, 1, 2], "mbps": [100, 50, 50]}, "compute": {"masked_s": 0.5, "local_full_s": 2.0},
           "fp16_bytes": 1000}
    yield {"type": "request", "unit": 0, "shard": 0, "level": "r8/a4/b4", "bytes": 100, "t": 0.0, "deadline": 0.1,
           "budget_bytes": 200, "window_s": 0.1, "rate_mbps": 90, "fits": True}
    yield {"type": "arrival", "unit": 0, "shard": 0, "level": "r8/a4/b4", "bytes": 100, "t": 0.05, "deadline": 0.1}
    yield {"type": "rebuilt", "unit": 0, "shard": 0, "t": 0.06}
    yield {"type": "shard_start", "shard": 0, "t": 0.06, "stall_s": 0.02}
    yield {"type": "request", "unit": 1, "shard": 1, "level": "r32/a8/b8", "bytes": 400, "t": 0.06, "deadline": 0.2,
           "rate_mbps": 80, "fits": False}


def test_timeline_folds_events_and_draws():
    progress = EditProgress(system="SAKURA")
    for ev in _events():
        progress.apply(ev)
    tl = progress.timeline  # the runtime's own Timeline, folded from its events
    assert progress.planned and len(tl.shards) == 2
    assert sum(s.exec_end_t is not None for s in tl.shards) == 0
    assert tl.stall_s == pytest.approx(0.02) and tl.bytes_received == 100
    assert "shards executed 0/2" in progress.status_line()
    fig = timeline_figure(progress)
    names = {t.name for t in fig.data}
    assert {"link (trace)", "in flight", "execute", "stall", "deadline", "rebuild"} <= names
    assert any(n and n.startswith("transfer") for n in names)
    progress.apply({"type": "shard_end", "shard": 0, "t": 0.3})
    assert tl.shards[0].exec_end_t == pytest.approx(0.3)
    progress.apply({"type": "error", "message": "boom"})
    assert progress.done and "boom" in progress.status_line()
    progress.apply({"type": "something-new", "x": 1})  # unknown events are ignored
    latency_figure([{"system": "SAKURA", "latency_s": 1, "stall_s": 0.1, "transfer_hidden_s": 0.3, "bytes": 10,
                     "fp16_bytes": 100}])


# ------------------------------------------------------------------------------------------ uploads
def test_photo_is_checked_once_and_travels_as_pixels(tmp_path):
    good = tmp_path / "face.png"
    Image.new("RGB", (1200, 800), (10, 20, 30)).save(good)
    photo = Photo.from_file(good)
    assert photo.pixels.shape == (256, 256, 3) and photo.pixels.dtype == np.uint8
    assert tuple(photo.pixels[128, 128]) == (10, 20, 30)
    again = Photo.from_wire(photo.to_wire())  # no image codec on the way: the same pixels
    np.testing.assert_array_equal(again.pixels, photo.pixels)
    assert from_b64(png_b64(photo.pixels)).size == (256, 256)
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    huge = tmp_path / "huge.png"
    Image.new("L", (7000, 7000)).save(huge)
    tiny = tmp_path / "tiny.png"
    Image.new("RGB", (4, 4)).save(tiny)
    for path, words in ((bad, "not an image"), (empty, "empty"), (huge, "too large"), (tiny, "at least")):
        with pytest.raises(EditRejected, match=words):
            Photo.from_file(path)
    for wire in ({"rgb8_b64": "AAAA", "size": 256}, {"size": 256}, "pixels"):
        with pytest.raises(EditRejected):
            Photo.from_wire(wire)


def test_diff_heatmap_marks_differences():
    a = Image.new("RGB", (32, 32), (100, 100, 100))
    b = a.copy()
    b.putpixel((5, 5), (255, 0, 0))
    mask = Image.new("L", (32, 32), 0)
    h = np.asarray(diff_heatmap(a, b, mask))
    assert h.shape == (32, 32, 3) and h[5, 5].sum() > h[20, 20].sum()


# ------------------------------------------------------------------------------------------- inputs
def test_trace_upload_validation(tmp_path):
    good = tmp_path / "walk.csv"
    good.write_text("time_s,mbps\n0,100\n1,50\n2,80\n")
    tr = check_trace_upload(good)
    assert tr.name == "walk.csv" and "median" in tr.summary() and tr.mbps == (100.0, 50.0, 80.0)
    assert TraceUpload.from_wire(tr.to_wire()).trace().median_mbps == tr.trace().median_mbps  # samples, not text
    ws = tmp_path / "two.txt"
    ws.write_text("0 10\n1 20\n")
    assert check_trace_upload(ws).name == "two.txt"
    for text in ("time_s,mbps\n0,abc\n", "hello world\n", "time_s,mbps\n", "\x00\x01\x02"):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(UploadError, match="cannot be used"):
            check_trace_upload(bad)
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(UploadError):
        check_trace_upload(binary)


def test_network_spec():
    assert network_spec("fixed", 2000, None, "", True) == NetworkSpec("fixed:2000", None, None, "none")
    assert network_spec("5g", None, None, "12.5", False).start == 12.5
    assert network_spec("wifi", None, None, "random", True).regime == "paper"
    upload = TraceUpload.from_text("time_s,mbps\n0,1\n", "t.csv")
    up = network_spec("upload", None, upload, None, True)
    assert up.upload is upload and up.trace == "t.csv"
    for args in (("fixed", "x", None, "", True), ("fixed", -5, None, "", True), ("upload", None, None, "", True),
                 ("5g", None, None, "soon", True), ("5g", None, None, "-1", True), ("nope", None, None, "", True)):
        with pytest.raises(UploadError):
            network_spec(*args)


def test_result_panels_never_show_the_input():
    res = {"system": "sakura", "metrics": {"psnr": 40.0, "ssim": 0.99, "psnr_masked": 35.0, "ssim_masked": 0.98},
           "summary": {"latency_s": 1.2, "stall_s": 0.1, "bytes": 500_000, "fp16_bytes": 5_000_000,
                       "transfer_hidden_s": 0.4, "transfer_exposed_s": 0.1, "levels": ["r8/a4/b4", "r16/a4/b4"]},
           "sent_to_server": [{"file_id": "fs-a", "ranges": [[0, 8], [8, 100], [200, 5], [300, 5]], "bytes": 118}]}
    html = metrics_html(res)
    assert "40.00" in html and "10.0% of the 5.0 MB" in html and "2 distinct" in html
    # the two stall figures agree: the link's share of the stalls, the rest named
    assert "stalls 0.100 s" in html and "0.100 s of the 0.100 s stalls waited on the link" in html
    stalls = metrics_html({**res, "summary": {**res["summary"], "stall_s": 0.239, "transfer_exposed_s": 0.2}})
    assert "0.200 s of the 0.239 s stalls waited on the link; the other 0.039 s on rebuilds" in stalls
    p = privacy_html(res, had_photo=True, had_prompt=False)
    assert "Your photo never left the device" in p and "fs-a" in p and "object store" not in p
    assert "its object store" in privacy_html({**res, "pack_bytes_from": "store"}, had_photo=True, had_prompt=False)
    assert privacy_rows(res["sent_to_server"]) == [[1, "fs-a", "0+8, 8+100, 200+5, … (4 ranges)", 118]]
    rows = compare_rows({"sakura": res})
    assert rows[0][0] == "SAKURA" and rows[0][6] == "10.0%"


# ----------------------------------------------------------------------------------------- explorer
def _frontier():
    pts = [{"system": s, "bytes": b, "config": c, "psnr": q, "ssim": 0.9, "psnr_masked": q - 3, "ssim_masked": 0.8,
            "image": "x.png"} for s, b, c, q in [("sakura", 100, "r8", 30), ("sakura", 400, "r32", 40),
                                                 ("intq", 300, "int2", 25), ("intq", 900, "int8", 45),
                                                 ("cachegen", 500, "L0", 28)]]
    return {"template_id": "t", "request": 0, "request_label": "r", "fp16_bytes": 2000, "points": pts}


def test_explorer_budget_choice_and_slider_mapping():
    data = _frontier()
    best = at_budget(data, 450)
    assert best["sakura"]["config"] == "r32" and best["intq"]["config"] == "int2" and best["cachegen"] is None
    assert at_budget(data, 50) == {"sakura": None, "intq": None, "cachegen": None}
    for b in (100, 450, 2000):
        assert budget_of(slider_of(b, data), data) == pytest.approx(b, rel=1e-6)
    assert budget_of(100, data) == pytest.approx(2000)
    assert budget_of(0, data) == 100 and at_budget(data, budget_of(0, data))["sakura"]["config"] == "r8"
    fig = frontier_figure(data, 450)
    assert len(fig.data) == 3 and fig.layout.xaxis.type == "log" and "masked" in fig.layout.yaxis.title.text
    assert list(fig.data[0].y) == [27, 37]  # masked PSNR by default


def test_explorer_lines_sit_at_the_markers_byte_positions():
    """On a log axis plotly places a shape in data units and an annotation in log10 units: the budget and FP16
    lines must land where a marker of the same bytes does (they once sat at 10^log10 of it)."""
    import math

    data = _frontier()
    data["points"].append({**data["points"][0], "bytes": 2000, "config": "r64"})  # a marker at the FP16 size
    fig = frontier_figure(data, 400)
    marker_x = {p["bytes"]: x for tr in fig.data for p, x in zip(sorted((q for q in data["points"] if q["system"] ==
                tr.name.lower()), key=lambda q: q["bytes"]), tr.x)}
    fp16_line, budget_line = fig.layout.shapes
    assert fp16_line.x0 == fp16_line.x1 == marker_x[2000]
    assert budget_line.x0 == marker_x[400]  # SAKURA's r32 point sends exactly the budget
    fp16_label, budget_label = fig.layout.annotations
    assert fp16_label.x == pytest.approx(math.log10(marker_x[2000])) and "FP16" in fp16_label.text
    assert budget_label.x == pytest.approx(math.log10(marker_x[400]))


def test_explorer_difference_map_is_amplified_and_says_nothing_where_identical():
    from app.explorer_page import difference

    ref = Image.new("RGB", (4, 4), (100, 100, 100))
    img = ref.copy()
    img.putpixel((1, 2), (103, 100, 90))
    d = np.asarray(difference(img, ref, 4))
    assert d[2, 1].tolist() == [12, 0, 40] and d.sum() == 52
    assert np.asarray(difference(img, ref, 16))[2, 1].tolist() == [48, 0, 160]
    assert _spread(list("abcdef"), 3) == ["a", "c", "f"]
    assert _spread([1, 2], None) == [1, 2] and _spread([1, 2, 3], 1) == [1]


# ------------------------------------------------------------------------ edit generator, fake device
class FakeBridge:
    """Speaks the device protocol from canned events: no model, no server."""

    def __init__(self, fail: dict | None = None):
        self.jobs, self.fail = [], fail or {}

    def templates(self):
        thumb = png_b64(Image.new("RGB", (8, 8), (200, 50, 50)))
        return [{"id": "fs-a", "task": "fs", "title": "Face", "model": "sakura-tiny", "mask_ratio": 0.1,
                 "token_ratio": 0.12, "n_eval": 5, "available": True, "thumbnail_png_b64": thumb},
                {"id": "mb-a", "task": "mb", "title": "Cup", "model": "sakura-tiny", "mask_ratio": 0.2,
                 "token_ratio": 0.2, "n_eval": 5, "available": True, "thumbnail_png_b64": thumb}]

    def edit(self, job, on_event=None):
        from device_bridge import EditFailed, EditRejected

        self.jobs.append(job)
        kind = self.fail.get(job.system)
        if kind == "rejected":
            on_event({"type": "error", "code": "rejected", "message": "bad photo"})
            raise EditRejected("bad photo")
        if kind == "failed":
            on_event({"type": "error", "code": "failed", "message": "server gone"})
            raise EditFailed("server gone")
        for ev in _events():
            on_event(ev)
        img = png_b64(Image.new("RGB", (16, 16), (10, 20, 30)))
        res = {"type": "result", "system": job.system, "image_png_b64": img, "reference_png_b64": img,
               "mask_png_b64": png_b64(np.zeros((16, 16), np.uint8)),
               "metrics": {"psnr": 50.0, "ssim": 1.0, "psnr_masked": 45.0, "ssim_masked": 1.0},
               "summary": {"latency_s": 0.5, "stall_s": 0.02, "bytes": 100, "fp16_bytes": 1000,
                           "transfer_hidden_s": 0.04, "transfer_exposed_s": 0.01, "levels": ["r8/a4/b4"]},
               "sent_to_server": [{"file_id": "fs-a", "ranges": [[0, 8]], "bytes": 8}]}
        on_event({"type": "output", "image_png_b64": img, "mask_png_b64": res["mask_png_b64"],
                  "summary": res["summary"], "reference_follows": True})
        on_event(res)
        return res


def _page(bridge):
    import gradio as gr

    from app.edit_page import EditPage

    with gr.Blocks():
        page = EditPage(bridge, bridge.templates())
        page.build()
    return page


def _html_of(updates, page, name):
    vals = [u[page._c[name]] for u in updates if page._c[name] in u]
    return [v if isinstance(v, str) else str(v) for v in vals]


def test_run_generator_compare_all_uses_one_trace_start():
    bridge = FakeBridge()
    page = _page(bridge)
    photo = Photo(np.zeros((256, 256, 3), np.uint8))
    ups = list(page.run("fs-a", photo, "", "5g", None, None, "", True, "all"))
    systems = [j.system for j in bridge.jobs]
    assert systems == ["sakura", "intq", "cachegen", "fp16", "local", "oracle"]
    starts = {j.network.start for j in bridge.jobs}
    assert len(starts) == 1 and None not in starts
    assert all(j.photo is photo and j.prompt == "" for j in bridge.jobs)  # the checked photo itself, once
    final = ups[-1]
    assert "Done: 6 systems ran" in final[page._c["status"]]
    assert len(final[page._c["compare"]]["value"]) == 6
    assert final[page._c["runs_state"]].keys() == set(systems)
    # re-showing another system's run from the stored events
    shown = page.on_view("intq", final[page._c["runs_state"]], photo, "", "fs-a")
    assert shown[0] is not None and "50.00" in shown[4]


def test_a_single_run_shows_its_output_before_the_reference_and_metrics():
    page = _page(FakeBridge())
    photo = Photo(np.zeros((256, 256, 3), np.uint8))
    ups = list(page.run("fs-a", photo, "", "fixed", 100, None, "", True, "sakura"))
    out, metrics = page._c["out_img"], page._c["metrics"]
    first_output = next(i for i, u in enumerate(ups) if out in u and u[out] is not None)
    first_metrics = next(i for i, u in enumerate(ups) if u.get(metrics))
    assert first_output < first_metrics  # the edit is on the page while its comparison is computed
    early = ups[first_output][page._c["status"]]
    assert "Done: SAKURA finished in 0.500 s" in early and "FP16-reference output for comparison" in early
    assert metrics not in ups[first_output] and page._c["ref_img"] not in ups[first_output]
    final = ups[-1]  # pictures, metrics and the summary line in one update
    assert "50.00" in final[metrics] and final[page._c["ref_img"]] is not None
    assert "Done: SAKURA finished" in final[page._c["status"]] and "comparison" not in final[page._c["status"]]


def test_run_generator_reports_problems_in_the_page():
    photo = Photo(np.zeros((256, 256, 3), np.uint8))
    page = _page(FakeBridge(fail={"sakura": "rejected"}))
    ups = list(page.run("fs-a", photo, "", "fixed", 100, None, "", True, "sakura"))
    assert "bad photo" in ups[-1][page._c["status"]] and "sk-warn" in ups[-1][page._c["status"]]
    bridge = FakeBridge(fail={"intq": "failed"})
    page = _page(bridge)
    ups = list(page.run("fs-a", photo, "", "fixed", 100, None, "", True, "all"))
    statuses = " ".join(_html_of(ups, page, "status"))
    assert "server gone" in statuses and "Done: 5 systems ran" in statuses  # the others still ran
    # input problems never reach the device
    bridge = FakeBridge()
    page = _page(bridge)
    for args, words in ((("mb-a", None, "   ", "5g", None, None, "", True, "sakura"), "prompt is empty"),
                        (("fs-a", None, "", "5g", None, None, "", True, "sakura"), "upload a face photo"),
                        (("fs-a", photo, "", "upload", None, None, "", True, "sakura"), "upload a trace file"),
                        (("nope", photo, "", "5g", None, None, "", True, "sakura"), "pick a template")):
        ups = list(page.run(*args))
        assert words in ups[-1][page._c["status"]]
    assert bridge.jobs == []
    # a prompt goes as the prompt, with no photo
    list(page.run("mb-a", photo, "make it blue", "5g", None, None, "3", False, "sakura"))
    job = bridge.jobs[-1]
    assert job.prompt == "make it blue" and job.photo is None
    assert job.network == NetworkSpec("5g", 3.0, None, "none")


def test_a_system_that_fell_back_says_so_in_its_label():
    from app.edit_panels import compare_rows, what_ran

    assert what_ran("fp16", []) == "FP16 (uncompressed)"
    local = [{"kind": "recompute", "shard": 0, "t": 0.1}, {"kind": "local", "shard": 4, "t": 0.4213}]
    assert what_ran("fp16", local) == "FP16 (uncompressed) (recomputed step 0) → local at 0.42 s"
    reuse = [{"kind": "reuse", "shard": 5, "t": 0.3}, {"kind": "reuse", "shard": 6, "t": 0.35}]
    assert what_ran("sakura", reuse) == "SAKURA (reused 2 shards)"
    rows = compare_rows({"fp16": {"summary": {"latency_s": 1.0}, "metrics": {}}}, {"fp16": local})
    assert rows[0][0].endswith("→ local at 0.42 s")


def test_picking_a_template_keeps_the_uploaded_photo():
    """A pick that registers after the upload must not lose it (#31 item 7); a text edit only hides it."""
    page = _page(FakeBridge())
    photo = Photo(np.full((256, 256, 3), 90, np.uint8))
    info, preview, prompt, upload, state, status, panel = page.on_template("fs-a", photo=photo)
    assert state is photo and preview["visible"] and preview["value"] is not None and "kept" in status
    assert "sk-device-panel" in panel  # the device panel follows the pick (an SD3 template says it runs eager)
    assert "value" not in upload  # the file component keeps what was uploaded
    *_, state, status, _ = page.on_template("mb-a", photo=photo)
    assert state is photo and "instruction" in status
    *_, state, status, _ = page.on_template("fs-a", photo=None)
    assert state is None and "upload a photo" in status


def test_templates_option_limits_what_the_edit_page_offers(tmp_path):
    import json

    from app.server import build_blocks

    def offered(ids):
        blocks = build_blocks(FakeBridge(), data_dir=tmp_path, offered=ids)
        dropdown = next(c for c in blocks.config["components"] if c.get("props", {}).get("elem_id") == "template-dd")
        return json.dumps(dropdown["props"]["choices"])

    assert "mb-a" in offered(None) and "fs-a" in offered(None)
    assert "mb-a" not in offered(["fs-a"]) and "fs-a" in offered(["fs-a"])
