"""Template server websocket stream mode, with and without trace shaping."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from pacing import assert_paced
from websockets.sync.client import connect

from sakura.net.client import FetchError, WsRangeClient
from sakura.net.shaping import BUCKET_BYTES, RateSpec
from sakura.server import RunningServer, start_server

SIZE = 2_000_000


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ws") / "packs"
    d.mkdir()
    (d / "tpl.pack").write_bytes(np.random.default_rng(2).bytes(SIZE))
    return d


@pytest.fixture(scope="module")
def server(packs: Path) -> Iterator[RunningServer]:
    with start_server(packs, access_log=packs.parent / "access.log") as s:
        yield s


@pytest.fixture(scope="module")
def data(packs: Path) -> bytes:
    return (packs / "tpl.pack").read_bytes()


def _ws_url(server: RunningServer, tid: str) -> str:
    return f"ws://{server.host}:{server.port}/ws/{tid}"


def test_ws_ranges_unshaped(server: RunningServer, data: bytes) -> None:
    with WsRangeClient(server.url) as c:
        for ranges in ([(0, 10)], [(5, 100), (1_000_000, 300_000), (0, 0), (SIZE - 1, 1)], [(0, SIZE)]):
            tr = c.fetch_timed("tpl", ranges)
            assert tr.parts == [data[o : o + n] for o, n in ranges]
            assert tr.nbytes == sum(n for _, n in ranges)
            assert tr.t_request <= tr.t_first_byte <= tr.t_last_byte
        assert len(c._conns) == 1  # one connection reused for every request


def test_ws_protocol_frames_and_errors(server: RunningServer, data: bytes) -> None:
    with connect(_ws_url(server, "tpl"), compression=None, max_size=None) as ws:
        ws.send(json.dumps({"id": "a", "ranges": [[0, 200_000], [10, 5]]}))
        assert json.loads(ws.recv()) == {"id": "a", "nbytes": 200_005}
        got = b""
        while len(got) < 200_005:
            frame = ws.recv()
            assert isinstance(frame, bytes) and len(frame) <= 64 * 1024
            got += frame
        assert got == data[:200_000] + data[10:15]
        assert json.loads(ws.recv()) == {"id": "a", "done": True}
        # Errors answer the request and keep the connection usable.
        for msg, status in [
            ('{"id": 1, "ranges": [[1999999, 2]]}', 416),
            ('{"id": 2, "ranges": [[-1, 2]]}', 400),
            ('{"id": 3, "ranges": [[0, 1.5]]}', 400),
            ('{"id": 4, "ranges": [[0, 1]], "rate": {"trace": "nope"}}', 400),
            ('{"id": 5, "ranges": [], "extra": 1}', 400),
            ("not json", 400),
        ]:
            ws.send(msg)
            reply = json.loads(ws.recv())
            assert reply["status"] == status and reply["error"], msg
        ws.send(b"\x00binary")
        assert json.loads(ws.recv())["status"] == 400
        ws.send('{"id": 6, "ranges": [[3, 4]]}')
        assert json.loads(ws.recv()) == {"id": 6, "nbytes": 4}
        assert ws.recv() == data[3:7]
        assert json.loads(ws.recv())["done"] is True


def test_ws_unknown_template_is_404(server: RunningServer) -> None:
    with pytest.raises(FetchError) as ei, WsRangeClient(server.url) as c:
        c.fetch("nope", [(0, 1)])
    assert ei.value.status == 404 and "unknown template 'nope'" in str(ei.value)
    with pytest.raises(FetchError) as ei, WsRangeClient(server.url) as c:
        c.fetch("..", [(0, 1)])
    assert ei.value.status in (400, 404)


def test_ws_header_bytes(tmp_path: Path) -> None:
    """The raw 8 + N header bytes by two range requests; an implausible length is refused first."""
    d = tmp_path / "packs"
    d.mkdir()
    head = json.dumps({"format": "intq", "units": [3]}).encode()
    raw = struct.pack("<Q", len(head)) + head
    (d / "tpl.intq.pack").write_bytes(raw + b"\x00" * 100)
    (d / "bogus.pack").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with start_server(d) as srv, WsRangeClient(srv.url) as c:
        assert c.header_bytes("tpl.intq") == raw
        assert c.header("tpl.intq") == {"format": "intq", "units": [3]}
        with pytest.raises(FetchError) as ei:
            c.header_bytes("bogus")
        assert ei.value.status == 422


def test_ws_shaped_transfer_follows_trace(server: RunningServer, data: bytes) -> None:
    # Start just before the synthetic 5G trace drops from 173 to 77.5 Mbps (t = 41 s).
    spec, n = RateSpec("5g", start=40.8, scale=0.1), 600_000
    trace = spec.load()
    with WsRangeClient(server.url, rate=spec) as c:
        tr = c.fetch_timed("tpl", [(0, n)])
        assert tr.parts[0] == data[:n]
        assert_paced(tr.active_s, trace.time_to_send(n - BUCKET_BYTES, spec.start))
        # The connection keeps its link: the next request continues along the same trace.
        pos = spec.start + (time.monotonic() - c._t0)
        tr2 = c.fetch_timed("tpl", [(n, 300_000)])
        assert tr2.parts[0] == data[n : n + 300_000]
        assert_paced(tr2.active_s, trace.time_to_send(300_000 - BUCKET_BYTES, pos))
        # reset_link restarts the link at rate.start, on the server too.
        c.reset_link()
        tr3 = c.fetch_timed("tpl", [(0, n)])
        assert_paced(tr3.active_s, trace.time_to_send(n - BUCKET_BYTES, spec.start))


def test_ws_fixed_rate_pacing(server: RunningServer) -> None:
    with WsRangeClient(server.url, rate=RateSpec("fixed:80")) as c:
        tr = c.fetch_timed("tpl", [(0, SIZE)])
    assert_paced(tr.active_s, (SIZE - BUCKET_BYTES) * 8 / 80e6)


def test_ws_disconnect_mid_stream_leaves_server_healthy(server: RunningServer, data: bytes) -> None:
    with connect(_ws_url(server, "tpl"), compression=None) as ws:
        ws.send(json.dumps({"id": 1, "ranges": [[0, SIZE]], "rate": {"trace": "fixed:4"}}))  # 4 s
        ws.recv()
        ws.recv()  # first data frame, then hang up
    time.sleep(0.1)
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    with WsRangeClient(server.url) as c:
        assert c.fetch("tpl", [(0, 1000)]) == [data[:1000]]


def test_ws_access_log_records_requests_not_messages(server: RunningServer, packs: Path) -> None:
    msg = '{"id": "log-me", "ranges": [[0, 3]], "rate": {"trace": "fixed:1000", "start": 1.5}}'
    with connect(_ws_url(server, "tpl"), compression=None) as ws:
        ws.send(msg)
        for _ in range(3):
            ws.recv()
    log = packs.parent / "access.log"
    deadline = time.monotonic() + 5
    while "log-me" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    recs = [json.loads(ln) for ln in log.read_text().splitlines()]
    mine = [r for r in recs if r.get("id") == "'log-me'"]
    assert len(mine) == 1 and mine[0]["path"] == "/ws/tpl"
    assert (mine[0]["ranges"], mine[0]["nbytes"], mine[0]["bytes"], mine[0]["size"]) == (1, 3, 3, len(msg))
    assert "fixed:1000" in mine[0]["rate"] and msg not in log.read_text()
    allowed = {"t", "method", "path", "event", "status", "bytes", "range", "trace", "id", "ranges", "nbytes",
               "rate", "size", "error", "reason"}
    assert all(set(r) <= allowed for r in recs)
