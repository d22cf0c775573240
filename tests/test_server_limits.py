"""The template server's limits, with real sockets: idle and slow clients, the connection cap, huge and
deeply nested websocket requests, clients that never read, bounded log records (issue 16.3)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from sakura.server.limits import ServerLimits
from sakura.server.run import READY_PREFIX, server_command, start_server

SIZE = 32 << 20  # larger than loopback socket buffers, so a client that never reads stalls the server


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("limit-packs")
    (d / "tpl.pack").write_bytes(os.urandom(1 << 16) * (SIZE >> 16))
    return d


@pytest.fixture(scope="module")
def server(packs):
    limits = ServerLimits(header_timeout_s=1.0, send_stall_s=1.0, ws_idle_s=3.0, max_ws_errors=8)
    with start_server(packs, access_log=packs / "access.log", limits=limits) as s:
        yield s


def _ws(server, **kw):
    return connect(f"ws://{server.host}:{server.port}/ws/tpl", compression=None, max_size=None, **kw)


def _request(ws, msg: str) -> dict:
    ws.send(msg)
    return json.loads(ws.recv(timeout=10))


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, socket.timeout):
        return False
    except ConnectionResetError:
        return True


def test_idle_sockets_do_not_starve_healthz(packs):
    """300 sockets that never send a byte, at an open-file limit of 256: /healthz still answers
    (it never did before: uvicorn holds a silent socket forever)."""
    def low_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    cmd = server_command(packs, limits=ServerLimits(header_timeout_s=1.0))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=low_fd_limit)
    idle: list[socket.socket] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith(READY_PREFIX), line
        url = line[len(READY_PREFIX):].strip()
        host, port = url.split("//")[1].rsplit(":", 1)
        time.sleep(0.5)  # let uvicorn start accepting
        idle = [socket.create_connection((host, int(port))) for _ in range(300)]
        t0, status = time.monotonic(), None
        while status != 200 and time.monotonic() - t0 < 8:  # a health checker retries (503 = at the cap)
            status = httpx.get(f"{url}/healthz", timeout=httpx.Timeout(15.0, connect=15.0)).status_code
        waited = time.monotonic() - t0
        assert status == 200 and waited < 8, (status, waited)
        print(f"/healthz answered in {waited:.2f} s beside 300 idle sockets (fd limit 256)")
        assert _closed_by_server(idle[0], 5.0)  # the idle ones were dropped after the head deadline
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)


def test_slow_request_head_is_cut(server):
    with socket.create_connection((server.host, server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        closed = False
        while time.monotonic() - t0 < 20 and not closed:
            try:
                s.sendall(b"X-Slow: 1\r\n")  # a byte now and then resets no timer
            except OSError:
                closed = True
                break
            closed = _closed_by_server(s, 0.3)
        assert closed  # (within the loop's 20 s: the head timeout, not the client, ended it)


def test_connection_cap_answers_503_then_recovers(packs):
    with start_server(packs, limits=ServerLimits(max_connections=8, header_timeout_s=30)) as srv:
        held = [socket.create_connection((srv.host, srv.port)) for _ in range(8)]
        time.sleep(0.2)
        assert httpx.get(f"{srv.url}/healthz").status_code == 503
        with pytest.raises(InvalidStatus) as e:
            connect(f"ws://{srv.host}:{srv.port}/ws/tpl", open_timeout=5)
        assert e.value.response.status_code == 503
        for s in held:
            s.close()
        time.sleep(0.2)
        assert httpx.get(f"{srv.url}/healthz").status_code == 200


def test_huge_websocket_range_request_is_refused(server):
    """An 840 KB message of 65,536 whole-file ranges once committed the server to sending 2 TB."""
    with _ws(server) as ws:
        many = json.dumps({"id": 1, "ranges": [[0, SIZE]] * 65536})
        reply = _request(ws, many)
        assert reply["status"] == 413 and "too many ranges" in reply["error"]
        reply = _request(ws, json.dumps({"id": 2, "ranges": [[0, SIZE]] * 4000}))
        assert reply["status"] == 413 and "more than the whole pack" in reply["error"]
        assert _request(ws, json.dumps({"id": 3, "ranges": [[0, 4]]})) == {"id": 3, "nbytes": 4}


def test_deeply_nested_json_is_a_clear_error(server):
    with _ws(server) as ws:
        for msg in ("[" * 100_000, '{"id": ' + "[" * 150 + "]" * 150 + ', "ranges": []}'):
            reply = _request(ws, msg)
            assert reply["status"] == 400 and ("not valid JSON" in reply["error"] or "id must be" in reply["error"])
        assert _request(ws, json.dumps({"id": 4, "ranges": [[0, 2]]})) == {"id": 4, "nbytes": 2}
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_log_records_are_bounded(server, packs):
    log = packs / "access.log"
    before = log.stat().st_size
    with _ws(server) as ws:
        for msg in (json.dumps({"id": "x" * 900_000, "ranges": []}), "y" * 900_000,
                    json.dumps({"id": 5, "ranges": [[0, 1]], "rate": {"trace": "z" * 900_000}})):
            assert _request(ws, msg)["status"] == 400
    httpx.get(f"{server.url}/packs/tpl?" + "q" * 12_000)
    time.sleep(0.3)
    grown = log.read_bytes()[before:]
    assert len(grown) < 30_000 and b"y" * 1000 not in grown and b"z" * 1000 not in grown, len(grown)
    assert all(len(line) < 10_000 for line in grown.splitlines())


def test_bad_requests_close_the_websocket_after_a_limit(server):
    with _ws(server) as ws:
        for _ in range(8):
            ws.send("nope")
        replies = [json.loads(ws.recv(timeout=5)) for _ in range(8)]
        assert all(r["status"] == 400 for r in replies)
        with pytest.raises(Exception):
            ws.recv(timeout=5)


def test_idle_websocket_is_closed(server):
    with _ws(server) as ws:
        t0 = time.monotonic()
        with pytest.raises(Exception):
            ws.recv(timeout=30)
        assert time.monotonic() - t0 > 2  # not before the idle limit (the 30 s recv timeout catches a hang)


def test_clients_that_never_read_are_dropped(server, packs):
    """A whole-pack request nobody reads: the server gives up after the stall timeout, on both transports."""
    log = packs / "access.log"
    with socket.create_connection((server.host, server.port)) as s, _ws(server, max_queue=1) as ws:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /packs/tpl HTTP/1.1\r\nHost: x\r\n\r\n")
        ws.send(json.dumps({"id": "stall", "ranges": [[0, SIZE]]}))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            text = log.read_text()
            if "client read nothing" in text and "client stopped reading" in text:
                break
            time.sleep(0.2)
    assert "client read nothing" in text and "client stopped reading" in text
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_agent_refuses_a_deeply_nested_job_and_stays_up():
    from device_bridge.agent import DeviceAgent
    from device_bridge.server import AgentServerThread

    with DeviceAgent("http://127.0.0.1:9") as agent, AgentServerThread(agent) as srv:
        for job in ("[" * 100_000, '{"template_id": ' + "[" * 5000 + "]" * 5000 + "}"):
            with connect(f"{srv.url}/v1/edit", max_size=None) as ws:
                ws.send(job)
                ev = json.loads(ws.recv(timeout=10))
            assert ev["type"] == "error" and ev["code"] == "rejected" and "not valid JSON" in ev["message"], ev
        assert httpx.get(srv.url.replace("ws://", "http://") + "/healthz", timeout=10).json()["status"] == "ok"
