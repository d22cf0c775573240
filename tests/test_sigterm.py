"""SIGTERM (systemd, docker, kill) stops a command with children as Ctrl-C does (issue #30 D6): the device
agent's local template server left running with parent PID 1 before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from device_bridge.server import READY_PREFIX


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def serving(url: str, timeout_s: float = 60.0) -> None:
    """Wait until the agent answers /healthz: the ready line comes once its socket is bound, before uvicorn has
    installed its own signal handlers (a loaded machine widens that window; the test is of the running agent)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the agent at {url} never answered /healthz")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_the_device_agent_stops_its_template_server(tmp_path):
    packs = tmp_path / "packs"
    packs.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "device_bridge", "--listen", "127.0.0.1:0", "--packs", str(packs)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    kids: list[int] = []
    try:
        line = proc.stdout.readline()
        assert line.startswith(READY_PREFIX), (line, proc.poll(), proc.stderr.read() if proc.poll() else "")
        kids = children(proc.pid)
        assert kids and all(alive(k) for k in kids)  # the local template server
        serving(line[len(READY_PREFIX):].strip().replace("ws://", "http://", 1))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read()
        deadline = time.monotonic() + 20
        while any(alive(k) for k in kids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(k) for k in kids), f"template server {kids} outlived its agent"
    finally:
        for k in kids + children(proc.pid):
            if alive(k):
                os.kill(k, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
