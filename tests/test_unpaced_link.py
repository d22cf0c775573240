"""The link the device does not pace (the kernel-shaped link's device side): requests in order on one worker, ranges
in growing groups so a cut keeps what came, a drop stops at once, live progress, a silent source retried. No root."""

from __future__ import annotations

import http.server
import threading
import time

import httpx
import pytest

from sakura.net.byteranges import Transfer, arrived
from sakura.net.client import RangeClient
from sakura.net.unpaced import UnpacedLink, groups


class Slow:
    """A source delivering each request's bytes after ``delay`` s per group (released by ``gate`` if given)."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None, down: int = 0) -> None:
        self.delay, self.gate, self.down = delay, gate, down
        self.calls: list[list] = []

    def fetch_timed(self, file_id, ranges):
        self.calls.append(list(ranges))
        if self.down > 0:
            self.down -= 1
            raise httpx.ConnectError("refused")
        t0 = time.monotonic()
        if self.gate is not None and len(self.calls) > 1:
            assert self.gate.wait(60)
        time.sleep(self.delay)
        parts = [bytes([i % 256]) * int(n) for i, (_, n) in enumerate(ranges)]
        for p in parts:
            arrived(len(p))
        t1 = time.monotonic()
        return Transfer(parts, sum(map(len, parts)), sum(map(len, parts)), t0, t1, t1)


def test_groups_grow_from_small_to_the_limit():
    sizes = [sum(n for _, n in g) for g in groups([(i * 8000, 8000) for i in range(100)], 64_000, 16_000)]
    assert sizes[:3] == [16_000, 32_000, 64_000] and max(sizes) <= 64_000 and sum(sizes) == 800_000
    assert groups([(0, 10**7), (10**7, 5)], 1000, 100) == [[(0, 10**7)], [(10**7, 5)]]  # one range a group at least


def test_requests_arrive_whole_and_in_order():
    link = UnpacedLink(Slow())
    try:
        a, b = link.send("f", [(0, 100), (100, 50)]), link.send("f", [(150, 10)])
        ta, tb = link.receive(a), link.receive(b)
        assert [len(p) for p in ta.parts] == [100, 50] and ta.nbytes == 150 and [len(p) for p in tb.parts] == [10]
        assert ta.t_request <= ta.t_first_byte <= ta.t_last_byte
        assert link.round_trips and all(rt >= 0 for rt in link.round_trips)
    finally:
        link.close()


def test_a_cut_keeps_the_largest_prefix_through_and_asks_no_more():
    gate = threading.Event()  # the second group waits until released
    src = Slow(gate=gate)
    link = UnpacedLink(src, group_bytes=64_000)
    try:
        ranges = [(i * 4096, 4096) for i in range(40)]  # groups: 4, 8, 16, 12 ranges (16 KiB first)
        flight = link.send("f", ranges)
        deadline = time.monotonic() + 30
        while len(flight.parts) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.progress(flight, 8192).delivered >= 16_384
        cut = threading.Event()
        cut.set()
        tr = link.receive(flight, cut, [2, 4, 12, 40])
        assert len(tr.parts) == 4 and tr.nbytes == 16_384
        gate.set()
        time.sleep(0.2)
        assert len(src.calls) <= 2  # the group in flight at the cut may finish; nothing after it is asked for
    finally:
        gate.set()
        link.close()


def test_a_drop_returns_at_once_with_what_came():
    gate = threading.Event()
    link = UnpacedLink(Slow(gate=gate), group_bytes=64_000)
    try:
        flight = link.send("f", [(i * 4096, 4096) for i in range(40)])
        drop = threading.Event()
        drop.set()
        time.sleep(0.1)
        tr = link.receive(flight, drop=drop)
        assert tr.parts == [] and tr.nbytes <= 16_384
    finally:
        gate.set()
        link.close()


def test_a_source_that_does_not_answer_is_a_silent_link_then_comes_back():
    link = UnpacedLink(Slow(down=2))
    try:
        flight = link.send("f", [(0, 10)])
        assert link.receive(flight).nbytes == 10
        assert link.outages and link.outages[0]["back_s"] is not None
    finally:
        link.close()


def test_a_closed_link_gives_up_at_once():
    gate = threading.Event()
    link = UnpacedLink(Slow(gate=gate))
    try:
        link.send("f", [(0, 10)])
        flight = link.send("f", [(10, 10)])
        threading.Timer(0.1, link.close).start()
        from sakura.net.paced import LinkClosed

        with pytest.raises(LinkClosed):
            link.receive(flight)
    finally:
        gate.set()


@pytest.mark.parametrize("args", [["loadtest", "--link", "kernel", "--store", "packs"],
                                  ["bench", "--clock", "both", "--link", "kernel", "--out", "unused"],
                                  ["bench", "--clock", "real", "--link", "tcp", "--out", "unused"]])
def test_without_root_a_kernel_link_is_refused_in_one_line(args, tmp_path):
    import subprocess
    import sys

    code = ("import os, sys; os.geteuid = lambda: 1000\n"
            "from sakura.cli import main\n"
            f"sys.argv = ['sakura', *{args!r}]; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-500:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-500:]
    assert ("needs root" in lines[0]) if "kernel" in args else ("--link must be one of paced, kernel" in lines[0])


def test_a_dropped_request_stuck_on_the_wire_does_not_hold_the_next_ones():
    """As a device closes a connection stuck in a trough: the next request goes on at once, beside it."""
    gate = threading.Event()

    class Stuck(Slow):
        def fetch_timed(self, file_id, ranges):
            if ranges[0][0] == 0:  # the first request hangs until released
                assert gate.wait(60)
            return super().fetch_timed(file_id, ranges)

    link = UnpacedLink(Stuck())
    try:
        first, second = link.send("f", [(0, 10)]), link.send("f", [(10, 10)])
        time.sleep(0.1)
        drop = threading.Event()
        drop.set()
        assert link.receive(first, drop=drop).parts == []
        assert link.receive(second).nbytes == 10  # (it would wait for the gate without the new worker)
    finally:
        gate.set()
        link.close()


class TrickleServer:
    """An HTTP server that answers any range request with ``size`` bytes in 4 KiB chunks every ``gap_s`` and
    records how far each answer got before the client went away."""

    def __init__(self, size: int = 1 << 20, gap_s: float = 0.005) -> None:
        outer = self
        self.sent: list[tuple[int, bool]] = []  # (bytes written, whether the client closed first)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                start = int(self.headers["Range"].split("=")[1].split("-")[0])
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{start + size - 1}/{start + size}")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                written = 0
                try:
                    while written < size:
                        self.wfile.write(b"x" * 4096)
                        self.wfile.flush()
                        written += 4096
                        time.sleep(gap_s)
                except OSError:
                    outer.sent.append((written, True))
                    return
                outer.sent.append((written, False))

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_dropped_request_stops_its_server_sending():
    """The bytes of a dropped request would share a shaped link with the requests after it (on a kernel link the
    estimate then read every later transfer at a fraction of the rate): its connection is closed at its next bytes."""
    size = 1 << 20  # 256 chunks, ≥ 1.3 s to send
    server = TrickleServer(size)
    client = RangeClient(server.url, pack_path="/{id}")
    link = UnpacedLink(client)
    try:
        flight = link.send("f", [(0, size)])
        deadline = time.monotonic() + 30
        while link.progress(flight).delivered < 16 * 4096 and time.monotonic() < deadline:
            time.sleep(0.01)
        drop = threading.Event()
        drop.set()
        assert link.receive(flight, drop=drop).parts == []
        while not server.sent and time.monotonic() < deadline:
            time.sleep(0.01)
        written, closed_first = server.sent[0]
        assert closed_first and written < size // 2, server.sent  # (without: all of it, to an abandoned reader)
    finally:
        link.close()
        client.close()
        server.close()
