"""The kernel-shaped link (issue #35): a network namespace whose loopback tc's token bucket shapes along a trace.

Server and client both run inside the namespace, on its loopback: no traffic leaves it. Ratios only: shaping
bounds a transfer from above even on a busy machine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from sakura.net import kernel
from sakura.net.traces import Trace

pytestmark = pytest.mark.skipif(kernel.unavailable() is not None, reason=str(kernel.unavailable()))

# Downloads ``url`` inside the namespace; prints [(time.monotonic(), bytes so far), ...] as JSON (the monotonic
# clock is the machine's: the same in the test process).
CLIENT = textwrap.dedent("""
    import json, sys, time, urllib.request
    t0 = float(sys.argv[2]); got, marks = 0, []
    with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
        while chunk := r.read(16384):
            got += len(chunk); marks.append((round(time.monotonic() - t0, 4), got))
    print(json.dumps(marks))
""")


def serve_inside(ns: kernel.Namespace, folder, port: int = 8765) -> subprocess.Popen:
    srv = ns.popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120  # a hang guard only: a loaded machine may take long to start Python
    while ns.run([sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"],
                 capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and srv.poll() is None, "server in the namespace did not start"
        time.sleep(0.1)
    return srv


def download(ns: kernel.Namespace, url: str, t0: float | None = None) -> list[tuple[float, int]]:
    """(seconds since ``t0`` — default: the request —, bytes so far) per chunk received."""
    t0 = time.monotonic() if t0 is None else t0
    out = ns.run([sys.executable, "-c", CLIENT, url, repr(t0)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    return [tuple(m) for m in json.loads(out.stdout)]


def test_a_namespace_is_made_shaped_and_removed_and_a_dead_processes_one_is_swept():
    child = subprocess.Popen([sys.executable, "-c", "from sakura.net.kernel import create_namespace; import time; "
                              "print(create_namespace(10).name, flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, text=True)
    stale = child.stdout.readline().strip()
    child.send_signal(signal.SIGKILL)  # no cleanup runs: its namespace stays behind
    child.wait()
    assert stale.startswith(kernel.PREFIX) and stale in kernel.namespaces()
    with kernel.create_namespace(20) as ns:  # the next one sweeps it
        assert stale not in kernel.namespaces() and ns.name in kernel.namespaces()
        shown = ns.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout
        assert "tbf" in shown and "20Mbit" in shown
        mtu = ns.run(["ip", "link", "show", "lo"], capture_output=True, text=True).stdout
        assert f"mtu {kernel.MTU}" in mtu
    assert ns.name not in kernel.namespaces()


def test_a_large_transfer_never_beats_the_shaped_rate(tmp_path):
    (tmp_path / "blob").write_bytes(np.random.default_rng(0).bytes(3_000_000))
    with kernel.create_namespace(20) as ns:
        srv = serve_inside(ns, tmp_path)
        try:
            marks = download(ns, "http://127.0.0.1:8765/blob")
        finally:
            srv.kill()
            srv.wait()
    took, got = marks[-1]
    assert got == 3_000_000
    rate = got * 8 / 1e6 / took
    print(f"3 MB over tbf 20 Mbit: {rate:.1f} Mbit/s in {took:.2f} s")
    assert rate <= 20 * 1.15


def test_a_zero_stretch_of_the_trace_stalls_the_transfer(tmp_path):
    (tmp_path / "blob").write_bytes(np.random.default_rng(1).bytes(6_000_000))
    trace = Trace(np.array([0.0, 1.5, 3.5, 60.0]), np.array([20.0, 0.0, 20.0]), "dip")
    with kernel.create_namespace(20) as ns:
        srv = serve_inside(ns, tmp_path)
        try:
            with kernel.TraceReplayer(ns, trace) as replay:
                marks = download(ns, "http://127.0.0.1:8765/blob", replay.t0)
        finally:
            srv.kill()
            srv.wait()
    assert marks[-1][1] == 6_000_000
    assert [round(m, 2) for _, m in replay.changes[:3]] == [20.0, kernel.FLOOR_MBPS, 20.0]
    t_zero, t_back = replay.changes[1][0], replay.changes[2][0]
    during = [b for t, b in marks if t_zero + 0.3 <= t <= t_back - 0.1]  # (a queue's worth drains at first)
    moved = (during[-1] - during[0]) if len(during) > 1 else 0
    print(f"bytes moved in the 0-Mbps stretch: {moved}; replayed changes {replay.changes[:3]}")
    assert moved < 64 * 1024  # at most a few packets at the floor rate
    before = max(b for t, b in marks if t < t_zero)
    after = [t for t, b in marks if b > before + 1_000_000]
    assert after and after[0] > t_back  # the transfer resumed only when the rate came back


def test_a_command_that_is_terminated_removes_its_namespace():
    """SIGTERM (as Ctrl-C) runs the command's cleanup: its namespace goes with it."""
    child = subprocess.Popen([sys.executable, "-c", "from sakura.net.kernel import link_for_command; import time\n"
                              "with link_for_command('kernel') as k:\n"
                              "    print(k.ns.name, flush=True); time.sleep(120)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    name = child.stdout.readline().strip()
    assert name.startswith(kernel.PREFIX) and name in kernel.namespaces()
    child.send_signal(signal.SIGTERM)
    child.wait(60)
    assert name not in kernel.namespaces()


def test_between_edits_the_loopback_is_not_shaped_and_an_edit_replays_its_trace():
    trace = Trace(np.array([0.0, 0.3, 60.0]), np.array([5.0, 0.0]), "step")
    with kernel.kernel_link() as link:
        def qdisc() -> str:
            return link.ns.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True).stdout

        def soon(cond) -> bool:  # (the namespace's batch tc applies a change a few ms later)
            deadline = time.monotonic() + 30
            while not cond() and time.monotonic() < deadline:
                time.sleep(0.02)
            return cond()

        assert "tbf" not in qdisc()
        with link.replaying(trace, 0.0) as replay:
            assert soon(lambda: "5Mbit" in qdisc())
        assert soon(lambda: "tbf" not in qdisc())
        assert replay.changes[0][1] == 5.0
    assert link.ns.name not in kernel.namespaces()


def test_a_streamed_edit_completes_over_a_kernel_link_that_drops_to_zero_mid_edit(fs_packs):
    """As on the device-paced link (tests/test_fallbacks.py): the link dies a third of the way through the masked
    run; the edit ends with fallbacks, not a timeout, and tc carried the trace (its zero at the floor rate)."""
    from sakura.net.client import RangeClient
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime, Network
    from sakura.server.run import start_server

    packs, tpl = fs_packs
    with kernel.kernel_link() as link:
        with kernel.entered(link.ns), start_server(packs, process=True) as srv, RangeClient(srv.url) as client:
            runtime = DeviceRuntime(client, calibration=CalibrationStore(repeats=1))
            probe = runtime.session(tpl, "sakura", Network(Trace.constant(50.0), "probe", 0.0, 1.0))
            req = probe.request(catalog_request=tpl.eval_requests[0])
            dip = Trace(np.array([0.0, 0.35 * probe.compute.masked_s, 600.0]), np.array([50.0, 0.0]), "dip")
            session = runtime.session(tpl, "sakura", Network(dip, "dip", 0.0, 1.0, kernel=link), timeout_s=30)
            assert session.network.link == "kernel"
            outcome = session.run(req)
        tl = outcome.timeline
        assert tl.extras["link"] == "kernel"
        assert [r for _, r in tl.extras["kernel_rates"]][:2] == [50.0, kernel.FLOOR_MBPS]
        assert tl.fallbacks, "the dead stretch was not noticed"  # reuse, or local on a loaded machine
        assert outcome.image.shape == req.template_image.shape if hasattr(req, "template_image") else True
        assert np.isfinite(outcome.image).all()
        assert tl.bytes_total > 0  # the fast third delivered cache bytes
    assert link.ns.name not in kernel.namespaces()


def test_a_loadtest_over_the_kernel_link_shares_one_shaped_cell(fs_packs):
    packs, _ = fs_packs
    before = set(kernel.namespaces())
    sakura = str(Path(sys.executable).with_name("sakura"))
    out = subprocess.run([sakura, "loadtest", "--link", "kernel", "--store", str(packs),
                          "--clients", "3", "--edits", "1", "--replicas", "1", "--trace", "fixed:20", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-1000:]
    summary = json.loads(out.stdout)
    assert summary["link"] == "kernel" and summary["errors"] == 0 and summary["edits"] == 3, summary
    assert set(kernel.namespaces()) <= before  # its namespace went with it


def test_sakura_edit_stream_over_the_kernel_link(fs_packs, tmp_path):
    """The command end to end: its own server and the device in a namespace it removes, tc along the scaled trace."""
    packs, _ = fs_packs
    before = set(kernel.namespaces())
    sakura = str(Path(sys.executable).with_name("sakura"))
    out = subprocess.run([sakura, "edit", "--stream", "-t", "fs-astronaut", "-r", "skimage:coffee", "--link", "kernel",
                          "--packs", str(packs), "--trace", "fixed:20", "--regime", "none", "--calibration",
                          str(tmp_path / "cal.json"), "--out", str(tmp_path / "out.png"), "--json"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-1000:]
    report = json.loads(out.stdout)
    assert report["link"] == "kernel" and report["timeline"]["extras"]["link"] == "kernel"
    assert report["timeline"]["extras"]["kernel_rates"][0][1] == 20.0
    assert report["bytes"] > 0 and (tmp_path / "out.png").is_file()
    assert set(kernel.namespaces()) <= before
