"""The phone-style stack in the live path (issue #33): one factory resolves ``--executor`` / ``--reconstructor``
for every caller, and an edit through ExecuTorch + OpenCL gives the eager + torch edit's output.

ExecuTorch export is slow on this CPU (minutes per template), so the device here exports ONE shard program —
layers [0, 2) at the packs' shard size, run at every step — and runs the other shards eagerly with the same
explicit attention (``BackendChoice.offload``, a partial offload the record names). The export is cached for the
test session. ``sakura bench --executor executorch`` and the demo run every shard as a program.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.net.folder import FolderSource
from sakura.net.traces import load_trace
from sakura.quality import quality
from sakura.runtime.backends import BackendChoice, Backends, program_key
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.executors import BackendUnavailable
from sakura.runtime.session import DeviceRuntime, EditInput, Network

OFFLOAD = ((0, 2),)


class FixedTicks:
    """Every timed rebuild costs one tick (as ``sakura bench --rebuild-clock tick``): both stacks see the same
    rebuild times on the simulated clock, so any difference in the levels chosen would be the stacks' own."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> float:
        self.n += 1
        return self.n * 0.002


def _opencl_or_skip() -> None:
    from sakura.runtime.reconstruct import available_reconstructors

    status = available_reconstructors()["opencl"]
    if status != "ok":
        pytest.skip(f"no OpenCL device here: {status}")


@pytest.fixture(scope="module")
def devices(fs_packs, tmp_path_factory):
    """Two devices over the same packs and one calibration: eager + torch, and ExecuTorch + OpenCL."""
    pytest.importorskip("executorch")
    _opencl_or_skip()
    packs, template = fs_packs
    calibration = CalibrationStore(tmp_path_factory.mktemp("cal") / "calibration.json", repeats=1)
    programs = tmp_path_factory.mktemp("programs")
    eager = DeviceRuntime(FolderSource(packs), calibration=calibration, backends=BackendChoice("eager", "torch"))
    phone = DeviceRuntime(FolderSource(packs), calibration=calibration,
                          backends=BackendChoice("executorch", "opencl", programs, offload=OFFLOAD))
    said: list[tuple[str, str]] = []
    phone.backends_for(phone.template_state(template), on_status=lambda stage, msg: said.append((stage, msg)))
    return template, eager, phone, programs, said


def _edit(runtime, template, network, clock, compute=None, rebuild_prior=None, **kw):
    session = runtime.session(template, "sakura", network, compute=compute)
    if rebuild_prior is not None:  # (another device's timed rebuild rate: its first plans price rebuilds alike)
        session.rebuild_prior_s_per_work = rebuild_prior
    req = template.eval_requests[0]
    report = session.edit(EditInput(catalog_request=req, key=0), clock=clock, with_reference=False, **kw)
    return session, report


def test_programs_exported_once_into_a_keyed_folder(devices):
    template, _, phone, programs, said = devices
    (folder,) = [p for p in programs.iterdir() if p.is_dir()]
    assert folder.name.startswith("sakura-tiny-s2-")
    assert len(list(folder.glob("*.pte"))) == len(OFFLOAD)  # one program per offloaded shard
    assert any(stage == "exporting" for stage, _ in said)  # progress went to the status sink
    # a second device over the same folder loads them: nothing is exported again
    again: list[str] = []
    other = DeviceRuntime(phone.source, calibration=phone.calibration, backends=phone.backends.choice)
    other.backends_for(other.template_state(template), on_status=lambda stage, msg: again.append(msg))
    assert not any("exporting shard" in m for m in again)


def test_same_levels_and_output_on_the_simulated_clock(devices):
    template, eager, phone, _, _ = devices
    network = Network(load_trace("5g"), "5g", start=40.0, regime="paper")
    s_e, r_e = _edit(eager, template, network, "sim", timer=FixedTicks())
    s_p, r_p = _edit(phone, template, network, "sim", compute=s_e.compute, timer=FixedTicks(),  # one calibration
                     rebuild_prior=s_e.rebuild_prior_s_per_work)
    assert [u.level for u in r_p.timeline.units] == [u.level for u in r_e.timeline.units]
    assert r_p.timeline.fallback_counts() == r_e.timeline.fallback_counts()
    # which backends ran: recorded in the plan, the summary and the timeline, and the objects are the real ones
    for rec in (r_p.plan["backends"], r_p.summary["backends"], r_p.timeline.extras["backends"]):
        assert (rec["executor"], rec["reconstructor"]) == ("executorch", "opencl")
        assert not rec["local_fallback"]
    assert (r_e.summary["backends"]["executor"], r_e.summary["backends"]["reconstructor"]) == ("eager", "torch")
    assert s_p.encoding.reconstructor.name == "opencl" and s_e.executor is None
    assert [e["layers"] for e in s_p.executor.exports] == [list(x) for x in OFFLOAD]
    assert s_p.fallback_context().allow_local is False and s_e.fallback_context().allow_local is True
    q = quality(r_p.image, r_e.image, r_e.request.mask)
    assert q["psnr_masked"] >= 60.0, q


def test_streamed_edit_on_the_real_clock(devices):
    """A real streamed edit (receive → rebuild → execute threads over a paced link) on the phone stack: the
    programs exported before the edit ran it, OpenCL rebuilt every unit, and its output is as close to the
    FP16-cache output as the eager + torch edit's is. (The levels may differ on the real clock: the policy
    prices each level's rebuild by the rebuilds it times, and the two stacks rebuild at different speeds;
    level-for-level agreement is the simulated clock's test above.)"""
    template, eager, phone, _, _ = devices
    network = Network(load_trace("fixed:20000"), "fixed:20000", start=0.0, scale=1.0, regime="none")
    req = template.eval_requests[0]
    r_e = eager.session(template, "sakura", network).edit(EditInput(catalog_request=req, key=0))
    s_p = phone.session(template, "sakura", network)
    r_p = s_p.edit(EditInput(catalog_request=req, key=0))
    assert r_p.summary["backends"]["label"] == "executorch+opencl"
    assert r_p.timeline.extras["backends"]["executor_title"] == "ExecuTorch (XNNPACK)"
    assert s_p.executor.exports and all(e["cached"] for e in s_p.executor.exports)  # exported before the edit
    assert all(u.rebuild_done_t is not None for u in r_p.timeline.units if not u.dropped)
    assert not r_p.timeline.fallback_counts().get("local")
    assert r_p.quality["psnr_masked"] >= min(30.0, r_e.quality["psnr_masked"] - 10.0), (r_p.quality, r_e.quality)
    # its plan and its clock check use the programs' own calibration (timed once, kept beside the eager one)
    stack = phone.calibration.get(s_p.model, template, s_p.compute.shards, "executorch-partial")
    assert stack is not None and s_p.compute.shard_s == stack.shard_s
    assert s_p.compute.local_full_s == s_p.state.compute.local_full_s  # local generation runs eager
    check = r_p.summary["compute_check"]
    assert check is not None and check["calibrated_s"] > 0 and "busy" in check


def test_sd3_runs_eager_and_says_why():
    from sakura.model import load_model

    sd3 = load_model("sakura-tiny-sd3")
    planned = Backends(BackendChoice("eager", "torch")).planned(sd3)
    assert planned["executor"] == "eager" and planned["note"] == ""
    pytest.importorskip("executorch")
    asked = Backends(BackendChoice("executorch", "torch"))
    planned = asked.planned(sd3)
    assert planned["executor"] == "eager" and "Flux2" in planned["note"] and "eager" in planned["note"]
    executor, rec, ran = asked.for_model(sd3, 2)
    assert executor is None and rec is None and ran.executor == "eager" and ran.local_fallback
    assert "Flux2" in ran.line()


def test_missing_backends_name_their_fallback(monkeypatch):
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    with pytest.raises(BackendUnavailable) as e:
        Backends(BackendChoice("qnn", "torch")).check()  # the SDK check comes first: no partitioner is reached
    msg = str(e.value)
    assert "\n" not in msg and "QNN_SDK_ROOT" in msg and msg.endswith("use --executor eager")
    monkeypatch.setenv("SAKURA_OPENCL_PLATFORM", "no-such-opencl-platform")  # no device matches
    with pytest.raises(BackendUnavailable) as e:
        Backends(BackendChoice("eager", "opencl")).check()
    assert "\n" not in str(e.value) and str(e.value).endswith("use --reconstructor torch")
    auto = Backends(BackendChoice("eager", "auto"))
    assert auto.check()["reconstructor"] == "torch" and "OpenCL unavailable" in auto.reconstructor_note
    with pytest.raises(ValueError, match="unknown executor"):
        BackendChoice("tflite", "torch")


def test_program_key_follows_weights_version_shard_size_and_codec():
    from sakura.model import load_model

    model = load_model("sakura-tiny")
    key = program_key(model, 2, "1.5.1")
    assert program_key(model, 2, "1.5.1") == key
    assert program_key(model, 3, "1.5.1") != key
    assert program_key(model, 2, "1.4.1") != key
    param = next(model.transformer.parameters())
    saved = param.detach().clone()
    try:
        with torch.no_grad():
            param.add_(1e-3)
        assert program_key(model, 2, "1.5.1") != key  # new weights: new folder, stale programs never load
    finally:
        with torch.no_grad():
            param.copy_(saved)
    assert program_key(model, 2, "1.5.1") == key
    assert np.isfinite(float(saved.abs().sum()))


def test_the_page_names_the_stack():
    """The device panel says what ran and where; every execute bar of the timeline names its executor."""
    from app.edit_panels import device_panel_html
    from app.timeline import timeline_figure
    from device_bridge.protocol import EditProgress

    device = {"executor": "executorch", "reconstructor": "opencl", "executor_title": "ExecuTorch (XNNPACK)",
              "reconstructor_title": "OpenCL (Intel CPU)", "where": "host CPU", "asked": "auto+auto", "note": ""}
    ran = {**device, "label": "executorch+opencl", "local_fallback": False}
    sd3 = {"id": "mb-sd-rocket", "backends": {**device, "executor": "eager", "executor_title": "eager PyTorch",
                                              "note": "ExecuTorch shard programs cover the Flux2 family"}}
    html = device_panel_html(device, ran)
    assert "ExecuTorch (XNNPACK)" in html and "OpenCL (Intel CPU)" in html and "host CPU" in html
    assert "local fallback is off" in html
    assert "eager PyTorch" in device_panel_html(device, template=sd3) and "Flux2" in device_panel_html(device,
                                                                                                       template=sd3)
    progress = EditProgress(system="SAKURA")
    for ev in ({"type": "accepted"}, {"type": "plan", "shards": [[0, 0, 2], [0, 2, 4]], "backends": ran},
               {"type": "shard_start", "shard": 0, "t": 0.1}, {"type": "shard_end", "shard": 0, "t": 0.2},
               {"type": "shard_start", "shard": 1, "t": 0.2}, {"type": "shard_end", "shard": 1, "t": 0.3}):
        progress.apply(ev)
    fig = timeline_figure(progress)
    (bars,) = [t for t in fig.data if (t.name or "").startswith("execute")]
    assert "ExecuTorch (XNNPACK)" in bars.name and list(bars.text) == ["ExecuTorch (XNNPACK)"] * 2
    assert "ExecuTorch (XNNPACK)" in bars.hovertemplate


def test_bench_rows_on_a_stack_beside_eager(fs_packs, tmp_path):
    """`sakura bench --reconstructor opencl`'s pieces on one template: the stack's costs are measured with
    bench-device's code, its rows are named and recorded with the backends that ran, and the side-by-side
    table has the ratios. (eager + OpenCL: no program to export, so the test stays quick.)"""
    _opencl_or_skip()
    from sakura.eval import bench
    from sakura.eval.bench_backends import StackBench, backends_markdown
    from sakura.eval.summary_stats import summarize

    packs, template = fs_packs
    prepared = bench.TemplateBench(template, packs, CalibrationStore(tmp_path / "cal.json", repeats=1))
    stack = StackBench(prepared, BackendChoice("eager", "opencl", tmp_path / "programs"), repeats=1,
                       say=lambda s: None)
    assert stack.ran.label == "eager+opencl" and stack.executor is None
    n = len(prepared.compute.shards)
    assert stack.cost.execute_ratio == [1.0] * n and len(stack.cost.rebuild_ms["opencl"]) == n
    assert stack.compute.shard_s == prepared.compute.shard_s  # eager on both sides: the same compute replayed
    base = load_trace("5g")
    trace = base.scaled(bench.regime_scale(prepared, base, "paper", None))
    rows = [bench.run_one(prepared, 0, "sakura", trace, 30.0),
            bench.run_one(stack, 0, "sakura", trace, 30.0, name=bench.stack_row_name("sakura", stack.ran))]
    assert [r["backends"] for r in rows] == ["eager+torch", "eager+opencl"]
    assert rows[1]["system"] == "sakura@eager+opencl" and rows[1]["template"] == template.id
    ws = summarize(rows, {})
    table = bench.ratio_table(ws, ("sakura",), [stack])
    row = table["latency"]["sakura@eager+opencl"]
    assert row["p50_ratio"] == pytest.approx(row["p50_s"][1] / row["p50_s"][0])
    md = backends_markdown({"workloads": {"fs": {**ws, "backends": table}}})
    assert "| fs | sakura | eager+opencl |" in md and f"| {template.id} | eager+opencl |" in md


def test_cli_and_agent_refuse_a_missing_backend_in_one_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from device_bridge.cli import run_agent
    from sakura.cli import app

    r = CliRunner().invoke(app, ["edit", "--stream", "-t", "fs-astronaut", "-r", "skimage:astronaut",
                                 "--executor", "tflite", "-o", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and r.stderr.startswith("error: unknown executor 'tflite'") and r.stderr.count("\n") == 1
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    with pytest.raises(ValueError) as e:  # before any server or model starts
        run_agent("127.0.0.1:0", None, tmp_path, executor="qnn")
    assert "QNN_SDK_ROOT" in str(e.value) and str(e.value).endswith("use --executor eager")


def test_auto_falls_back_and_says_why_when_executorch_cannot_import(monkeypatch):
    import sakura.runtime.executors.executorch_backend as etb

    def missing() -> str:
        raise BackendUnavailable("the executorch backend needs the 'executorch' package (pip install executorch)")

    monkeypatch.setattr(etb, "require_executorch", missing)
    auto = Backends(BackendChoice("auto", "torch"))
    assert auto.check() == {"executor": "eager", "reconstructor": "torch"}
    assert auto.note.startswith("ExecuTorch unavailable (") and "pip install executorch" in auto.note
    with pytest.raises(BackendUnavailable) as e:
        Backends(BackendChoice("executorch", "torch")).check()
    assert "\n" not in str(e.value) and str(e.value).endswith("use --executor eager")
