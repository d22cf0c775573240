"""Errors outside the stream and oversized images: one clear line and exit 2, never a traceback or a
long hang; zero bandwidth (an outage at the start, a median of 0) is a link, not a crash (issue 16.4, 16.6)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from sakura.cli import app
from sakura.net.traces import Trace, load_trace, paper_regime_scale
from sakura.online.monitor import MIN_INITIAL_BPS, RuntimeMonitor
from sakura.server.run import start_server

TEMPLATE = "fs-astronaut"
REAL_OUTAGES = Path("/work/shared/traces/4g5g-mixed-600s.csv")  # a measured trace with 0 Mbps seconds


@pytest.fixture(scope="module")
def packs(fs_packs) -> Path:
    return fs_packs[0]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cal") / "calibration.json"


def sakura(*args: str, stdout: bool = False) -> tuple[int, str, float]:
    """``sakura ARGS`` in this process: (exit code, stderr — or stdout — , seconds)."""
    t0 = time.monotonic()
    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout if stdout else r.stderr, time.monotonic() - t0


def one_line_error(code: int, err: str) -> bool:
    """Exit 2 with one ``error:`` line, the last thing said (status lines such as "loading the model" may come
    before it), and no traceback."""
    lines = err.strip().splitlines()
    return (code == 2 and bool(lines) and lines[-1].startswith("error: ") and "Traceback" not in err
            and sum(line.startswith("error") for line in lines) == 1)


def stream_args(packs: Path, calibration: Path, out: Path, *extra: str) -> list[str]:
    return ["edit", "--stream", "-t", TEMPLATE, "-r", "skimage:astronaut", "--packs", str(packs),
            "--calibration", str(calibration), "-o", str(out), *extra]


def test_huge_images_are_refused_before_decoding(tmp_path, packs):
    """A 10000×10000 PNG is 97 KB on disk and was 2.9 GB and 55 s of work; now refused from its header."""
    Image.new("L", (10_000, 10_000)).save(tmp_path / "bomb.png", optimize=True)
    Image.new("RGB", (5000, 300)).save(tmp_path / "wide.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    for name, why in (("bomb", "too large"), ("wide", "5000×300 px"), ("junk", "not an image")):
        for extra in ([], ["--stream", "--packs", str(packs)]):
            code, err, _ = sakura("edit", "-t", TEMPLATE, "-r", str(tmp_path / f"{name}.png"),
                                  "-o", str(tmp_path / "o.png"), *extra)
            # "too large" / "5000×300 px" are the header check's words: the bomb is never decoded (that took 55 s)
            assert one_line_error(code, err) and why in err, err


def test_server_down_before_the_edit(packs, calibration, tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err, _ = sakura(*stream_args(packs, calibration, tmp_path / "o.png", "--server", f"http://127.0.0.1:{port}"))
    assert one_line_error(code, err) and "ConnectError" in err and str(port) in err, err


def test_connection_cut_during_the_header_read(packs, calibration, tmp_path):
    lst = socket.create_server(("127.0.0.1", 0))

    def cut() -> None:  # read the request, answer nothing, hang up
        while True:
            try:
                conn, _ = lst.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    threading.Thread(target=cut, daemon=True).start()
    try:
        code, err, _ = sakura(*stream_args(packs, calibration, tmp_path / "o.png", "--server",
                                           f"http://127.0.0.1:{lst.getsockname()[1]}"))
    finally:
        lst.close()
    assert one_line_error(code, err) and "RemoteProtocolError" in err, err


@pytest.fixture(scope="module")
def server(packs):
    with start_server(packs) as srv:
        yield srv


def test_hopeless_link_goes_local(server, packs, calibration, tmp_path):
    """fixed:0.001 Mbps unscaled: the cache cannot arrive in time, so the edit runs locally and says so
    (it was a 66 s ReadTimeout traceback, then a 60 s wait, then a refusal)."""
    code, out, took = sakura(*stream_args(packs, calibration, tmp_path / "o.png", "--server", server.url,
                                          "--trace", "fixed:0.001", "--regime", "none"), stdout=True)
    assert code == 0 and "switch to local generation" in out, out
    assert (tmp_path / "o.png").is_file()
    print(f"fixed:0.001 (regime none) went local in {took:.1f} s")


def test_trace_down_at_the_start_with_median_zero_finishes(server, packs, calibration, tmp_path):
    """0 Mbps for the first 6 s of every 10 (median 0, rate 0 at the start offset): the edit waits for
    the link and finishes (it was ZeroDivisionError, then 'initial rate must be positive')."""
    trace = tmp_path / "outage.csv"
    trace.write_text("time_s,mbps\n" + "".join(f"{t},{0 if t < 6 else 200}\n" for t in range(10)))
    code, err, took = sakura(*stream_args(packs, calibration, tmp_path / "o.png", "--server", server.url,
                                          "--trace", str(trace), "--start", "0"))
    assert code == 0, err
    assert (tmp_path / "o.png").is_file()
    print(f"edit over a trace down at its start (median 0) finished in {took:.1f} s")


def test_zero_bandwidth_units():
    flat = Trace.from_samples(np.arange(10.0), np.array([0, 0, 0, 0, 0, 0, 200, 200, 200, 200.0]))
    assert flat.median_mbps == 0 and paper_regime_scale(flat, 1e6, 1.0) > 0
    assert RuntimeMonitor(0.0).rate_bps == MIN_INITIAL_BPS and RuntimeMonitor(float("nan")).initial_bps > 0
    edges, rates = flat.steps(0.0, 5.0)
    assert list(edges) == [0, 1, 2, 3, 4, 5] and not rates.any()  # an all-zero window is a link too


def test_bench_on_a_trace_that_is_never_up_is_one_line(tmp_path, packs, calibration):
    """issue #30 D4: an all-zero trace was a ZeroDivisionError in the regime block (a median-0 trace now scales
    from its non-zero samples: tests/test_hostile_rates.py)."""
    (tmp_path / "z.csv").write_text("time_s,mbps\n0,0\n1,0\n2,0\n")
    code, err, _ = sakura("bench", "--workloads", "fs", "--systems", "sakura,local", "--starts", "2", "--trace",
                          str(tmp_path / "z.csv"), "--packs", str(packs), "--calibration", str(calibration),
                          "--out", str(tmp_path / "bench"))
    assert one_line_error(code, err) and "0 Mbps throughout" in err, err


@pytest.mark.parametrize("system", ["sakura", "intq", "fp16"])
def test_simulated_edit_starting_in_an_outage(server, calibration, system):
    """`sakura bench --trace` on a measured trace crashed at offsets where the rate is 0."""
    from sakura.catalog import load_catalog
    from sakura.net.client import RangeClient
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime, Network

    trace = load_trace(REAL_OUTAGES) if REAL_OUTAGES.is_file() else Trace.from_samples(
        np.arange(20.0), np.r_[np.full(10, 300.0), np.zeros(3), np.full(7, 30.0)])
    start = float(trace.edges[np.flatnonzero(trace.mbps == 0)[0]])
    tpl = load_catalog().get(TEMPLATE)
    with RangeClient(server.url) as client:
        runtime = DeviceRuntime(client, calibration=CalibrationStore(calibration))
        session = runtime.session(tpl, system, Network(trace, "outages", start, None, "paper"))
        assert session.initial_bps == 0
        outcome = session.simulate(session.request(catalog_request=tpl.eval_requests[0]))
        assert outcome.timeline.latency_s > 0
        assert not any(session.plan()["trace"]["mbps"][:1])  # the plan shows the outage


def test_agent_reports_a_trace_problem_as_rejected():
    from device_bridge.agent import DeviceAgent
    from sakura.net.traces import TraceError

    agent = DeviceAgent.__new__(DeviceAgent)  # _describe needs no state
    agent.server_url = "http://127.0.0.1:9"
    assert agent._describe(TraceError("trace@0+30: trace has no bandwidth (all rates are 0)"))[1] == "rejected"


def test_commands_share_one_default_packs_folder_never_the_working_directory(tmp_path, monkeypatch):
    """#32 item 4: `--packs` defaulted to ./packs, so a bench run from another folder built packs there."""
    from sakura.places import CHECKOUT, default_packs

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("SAKURA_PACKS", raising=False)
    assert default_packs() == CHECKOUT / "packs"  # an editable checkout keeps its packs beside its code
    monkeypatch.setenv("SAKURA_PACKS", str(tmp_path / "shared"))
    code, err, _ = sakura("serve", "--port", "0")
    assert f"packs: {tmp_path / 'shared'} (default)" in err and "does not exist" in err and code == 2, err
    code, err, _ = sakura("report", "importance", "--templates", "nope")
    assert f"packs: {tmp_path / 'shared'} (default)" in err, err
    assert not (elsewhere / "packs").exists()
