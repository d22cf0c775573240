"""How the app reaches a device agent: one small interface, four transports.

>>> from device_bridge import connect
>>> with connect("subprocess", server_url="http://127.0.0.1:8600") as bridge:
...     bridge.templates()                       # catalog + thumbnails
...     result = bridge.edit(job, on_event=print) # blocking; events as they happen

Specs for :func:`connect`:

* ``inprocess`` — a :class:`DeviceAgent` in this process (no serialisation, no sockets).
* ``subprocess`` — spawns ``python -m device_bridge --listen 127.0.0.1:0 …``, reads its URL from
  its first stdout line, talks websocket to it, kills it on :meth:`Bridge.close`.
* ``ws://HOST:PORT`` or ``tcp://HOST:PORT`` — an agent already running elsewhere.
* ``adb``, ``adb:SERIAL`` or ``adb:SERIAL:PORT`` — an agent on an Android phone (started there with
  ``python -m device_bridge --listen 127.0.0.1:8700 --server URL``): runs ``adb forward tcp:P tcp:P``
  and connects to ``ws://127.0.0.1:P``. Clear errors when adb or a device is missing.

Every ``edit`` raises :class:`EditRejected` (bad input: show the message to the user) or
:class:`EditFailed` (the edit could not finish) with a one-line message; :class:`BridgeError`
when the agent itself cannot be reached.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect
from websockets.sync.client import unix_connect as ws_unix_connect

from device_bridge.agent import DeviceAgent
from device_bridge.protocol import EditFailed, EditRejected, Job, NetworkSpec, one_line
from device_bridge.server import READY_PREFIX, UNIX_PREFIX

EventCallback = Callable[[dict], None]
DEFAULT_ADB_PORT = 8700


class BridgeError(RuntimeError):
    """The device agent cannot be reached or started; the message is one line and says what to do."""


class Bridge(ABC):
    """What the app uses. ``edit`` blocks until the result; ``on_event`` gets every event (dicts as
    in docs/device-protocol.md), including the final ``result`` or ``error``."""

    url: str | None = None

    @abstractmethod
    def templates(self) -> list[dict]: ...

    @abstractmethod
    def edit(self, job: Job | dict, on_event: EventCallback | None = None) -> dict: ...

    def health(self) -> dict:
        return {"status": "ok"}

    def warmup(self, template_id: str) -> dict:
        """Load the model and calibrate compute for a template ahead of its first edit."""
        return {}

    def prefetch(self, template_id: str, network: NetworkSpec | dict | None = None) -> dict:
        """The person picked a template: the device starts fetching its pack (returns at once)."""
        return {}

    def close(self) -> None:
        pass

    def __enter__(self) -> "Bridge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _raise_for_error(ev: dict) -> None:
    msg, code = ev.get("message") or "edit failed", ev.get("code") or "failed"
    if code == "rejected":
        raise EditRejected(msg)
    raise EditFailed(msg, code)


class InProcessBridge(Bridge):
    def __init__(self, agent: DeviceAgent | None = None, **agent_kw: Any) -> None:
        self.agent = agent or DeviceAgent(**agent_kw)
        self._owned = agent is None
        self.url = None

    def templates(self) -> list[dict]:
        return self.agent.templates()

    def edit(self, job: Job | dict, on_event: EventCallback | None = None) -> dict:
        return self.agent.edit(job, on_event)  # the Job object itself: nothing to serialise or re-parse

    def health(self) -> dict:
        return self.agent.health()

    def warmup(self, template_id: str) -> dict:
        return self.agent.warmup(template_id)

    def prefetch(self, template_id: str, network: NetworkSpec | dict | None = None) -> dict:
        return self.agent.prefetch(template_id, network)

    def close(self) -> None:
        if self._owned:
            self.agent.close()


class WsBridge(Bridge):
    """A running agent at ``ws://HOST:PORT`` (one websocket per edit)."""

    def __init__(self, url: str, open_timeout: float = 10.0, event_timeout: float | None = 900.0) -> None:
        u = url.rstrip("/")
        if u.startswith("tcp://"):
            u = "ws://" + u[len("tcp://"):]
        self.uds = u[len(UNIX_PREFIX):] if u.startswith(UNIX_PREFIX) else None  # a Unix socket (unix:PATH)
        if self.uds is None and not u.startswith(("ws://", "wss://")):
            raise BridgeError(f"agent URL must be ws://HOST:PORT, tcp://HOST:PORT or unix:PATH, got {url!r}")
        self.url = u
        self.http_url = "http://agent" if self.uds else "http" + u[2:]
        self.open_timeout, self.event_timeout = open_timeout, event_timeout

    def _ws(self, path: str):
        if self.uds:
            return ws_unix_connect(self.uds, "ws://agent" + path, open_timeout=self.open_timeout, max_size=None,
                                   compression=None)
        return ws_connect(self.url + path, open_timeout=self.open_timeout, max_size=None, compression=None)

    def _get(self, path: str, method: str = "GET", timeout: float = 30.0, json: Any = None) -> Any:
        try:
            if self.uds:
                with httpx.Client(transport=httpx.HTTPTransport(uds=self.uds), timeout=timeout) as c:
                    r = c.request(method, self.http_url + path, json=json)
            else:
                r = httpx.request(method, self.http_url + path, timeout=timeout, json=json)
        except httpx.HTTPError as e:
            raise BridgeError(f"cannot reach the device agent at {self.url}: {type(e).__name__}: {one_line(e, 200)}") \
                from None
        if r.status_code >= 400:
            try:
                body = r.json()
            except ValueError:
                body = {"error": r.text[:200]}
            _raise_for_error({"message": body.get("error"), "code": body.get("code", "failed")})
        return r.json()

    def health(self) -> dict:
        return self._get("/healthz", timeout=5.0)

    def templates(self) -> list[dict]:
        return self._get("/v1/templates")

    def warmup(self, template_id: str) -> dict:
        return self._get(f"/v1/warmup/{template_id}", method="POST", timeout=600.0)

    def prefetch(self, template_id: str, network: NetworkSpec | dict | None = None) -> dict:
        body = {"network": network.to_wire() if isinstance(network, NetworkSpec) else network}
        return self._get(f"/v1/prefetch/{template_id}", method="POST", timeout=60.0, json=body)

    def edit(self, job: Job | dict, on_event: EventCallback | None = None) -> dict:
        try:
            payload = json.dumps(job.to_wire() if isinstance(job, Job) else job)
        except (TypeError, ValueError) as e:
            raise EditRejected(f"the job is not JSON-serialisable: {one_line(e, 200)}") from None
        try:
            conn = self._ws("/v1/edit")
        except Exception as e:  # noqa: BLE001 - refused, DNS, timeout, bad handshake
            raise BridgeError(f"cannot reach the device agent at {self.url}: {type(e).__name__}: "
                              f"{one_line(e, 200)}") from None
        with conn:
            try:
                conn.send(payload)
                while True:
                    text = conn.recv(timeout=self.event_timeout)
                    ev = json.loads(text)
                    if on_event is not None:
                        on_event(ev)
                    if ev.get("type") == "result":
                        return ev
                    if ev.get("type") == "error":
                        _raise_for_error(ev)
            except ConnectionClosed:
                raise BridgeError(f"the device agent at {self.url} closed the connection before the result") from None
            except TimeoutError:
                raise BridgeError(f"no event from the device agent at {self.url} for {self.event_timeout:.0f} s") \
                    from None


class SubprocessBridge(WsBridge):
    """An agent in a child process of ours (``python -m device_bridge``)."""

    READY_TIMEOUT_S = 120.0

    def __init__(self, server_url: str | None = None, catalog: str | Path | None = None,
                 packs_dir: str | Path | None = None, *, link: str = "ws", timeout_s: float | None = None,
                 calibration_file: str | Path | None = None, calibration_repeats: int = 1,
                 extra_args: tuple[str, ...] = (), python: str | None = None, port: int = 0,
                 executor: str | None = None, reconstructor: str | None = None,
                 programs: str | Path | None = None, listen: str | None = None,
                 kernel_ns: str | None = None) -> None:
        """``port``: where the agent listens on 127.0.0.1 (0: any free port); ``listen``: instead, e.g. unix:PATH.
        ``kernel_ns``: the agent runs inside that sakura network namespace (``ip netns exec``; its links are
        shaped there by tc): reach it through a Unix socket."""
        if server_url is None and packs_dir is None:
            raise BridgeError("the subprocess transport needs server_url (or packs_dir to serve)")
        cmd = ["ip", "netns", "exec", kernel_ns] if kernel_ns else []
        cmd += [python or sys.executable, "-m", "device_bridge", "--listen", listen or f"127.0.0.1:{int(port)}",
                "--link", link]
        cmd += ["--kernel-ns", kernel_ns] if kernel_ns else []
        cmd += ["--server", str(server_url)] if server_url else ["--packs", str(packs_dir)]
        cmd += ["--catalog", str(catalog)] if catalog else []
        cmd += ["--timeout", str(timeout_s)] if timeout_s else []
        cmd += ["--calibration", str(calibration_file)] if calibration_file else []
        cmd += ["--calibration-repeats", str(int(calibration_repeats))] if calibration_repeats != 1 else []
        cmd += ["--executor", executor] if executor else []
        cmd += ["--reconstructor", reconstructor] if reconstructor else []
        cmd += ["--programs", str(programs)] if programs else []
        cmd += list(extra_args)
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._drain, args=(self.proc.stderr, self._stderr), daemon=True).start()
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.READY_TIMEOUT_S)
        line = lines[0] if lines else ""
        if not line.startswith(READY_PREFIX):
            self.close()
            time.sleep(0.1)
            why = " | ".join(s.strip() for s in list(self._stderr)[-3:] if s.strip()) or "no output"
            raise BridgeError(f"the device agent process did not start: {one_line(why, 300)}")
        threading.Thread(target=self._drain, args=(self.proc.stdout, None), daemon=True).start()
        super().__init__(line[len(READY_PREFIX):].strip())
        deadline = time.monotonic() + 30
        while True:  # bound, but is it serving yet?
            try:
                self.health()
                break
            except BridgeError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise BridgeError(f"the device agent process at {self.url} never answered") from None
                time.sleep(0.05)

    @staticmethod
    def _drain(stream, keep) -> None:
        for line in iter(stream.readline, ""):
            if keep is not None:
                keep.append(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        p = getattr(self, "proc", None)
        if p is not None and p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def adb_devices(adb: str) -> list[tuple[str, str]]:
    """``(serial, state)`` rows of ``adb devices``."""
    try:
        out = subprocess.run([adb, "devices"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BridgeError(f"`adb devices` failed: {one_line(e, 200)}") from None
    if out.returncode != 0:
        raise BridgeError(f"`adb devices` failed: {one_line(out.stderr or out.stdout, 200)}")
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith(("List of devices", "*")):
            rows.append((parts[0], parts[1]))
    return rows


def adb_device(serial: str | None = None) -> tuple[str, str]:
    """``(adb path, serial)`` of the one attached, authorised phone (or ``serial``); a :class:`BridgeError` of one
    line when adb is missing, no device is attached, or the device is not usable. Starts nothing but adb's own
    server (``adb devices``)."""
    adb = shutil.which("adb")
    if adb is None:
        raise BridgeError("adb is not installed (not on PATH): install Android platform-tools "
                          "(e.g. `apt install adb`) or use another transport (inprocess, subprocess, ws://HOST:PORT)")
    devices = adb_devices(adb)
    ready = [s for s, state in devices if state == "device"]
    if not devices:
        raise BridgeError("no Android device attached (`adb devices` lists none): connect a phone with USB "
                          "debugging enabled")
    if serial is None:
        if not ready:
            states = ", ".join(f"{s} ({st})" for s, st in devices)
            raise BridgeError(f"no usable Android device: {states}; authorise USB debugging on the phone")
        if len(ready) > 1:
            raise BridgeError(f"several Android devices attached ({', '.join(ready)}): use adb:SERIAL")
        return adb, ready[0]
    if serial not in ready:
        known = ", ".join(f"{s} ({st})" for s, st in devices)
        raise BridgeError(f"Android device {serial!r} is not attached and ready (adb sees: {known})")
    return adb, serial


def preflight(spec: str) -> None:
    """Check what a transport needs on this host before anything else starts (``sakura demo`` calls it first):
    for ``adb`` / ``adb:SERIAL[:PORT]``, adb and the phone; the other transports need nothing checked here."""
    if spec.strip() == "adb" or spec.strip().startswith("adb:"):
        adb_device(_adb_spec(spec)[0])


def _adb_spec(spec: str) -> tuple[str | None, int]:
    parts = spec.strip().split(":")[1:]
    serial = parts[0] or None if parts else None
    port = DEFAULT_ADB_PORT
    if len(parts) > 1:
        if not parts[1].isdigit():
            raise BridgeError(f"bad adb spec {spec!r}: use adb, adb:SERIAL or adb:SERIAL:PORT")
        port = int(parts[1])
    return serial, port


class AdbBridge(WsBridge):
    """An agent on an Android phone, reached through ``adb forward``."""

    def __init__(self, serial: str | None = None, port: int = DEFAULT_ADB_PORT) -> None:
        adb, serial = adb_device(serial)
        self.adb, self.serial, self.port = adb, serial, port
        fwd = subprocess.run([adb, "-s", serial, "forward", f"tcp:{port}", f"tcp:{port}"], capture_output=True,
                             text=True, timeout=20)
        if fwd.returncode != 0:
            raise BridgeError(f"`adb forward tcp:{port} tcp:{port}` failed: {one_line(fwd.stderr or fwd.stdout, 200)}")
        super().__init__(f"ws://127.0.0.1:{port}")
        try:
            self.health()
        except BridgeError:
            self.close()
            raise BridgeError(f"no device agent answers on the phone's port {port}: start it there with "
                              f"`python -m device_bridge --listen 127.0.0.1:{port} --server URL`") from None

    def close(self) -> None:
        subprocess.run([self.adb, "-s", self.serial, "forward", "--remove", f"tcp:{self.port}"],
                       capture_output=True, timeout=20)


def connect(spec: str = "inprocess", **kw: Any) -> Bridge:
    """A bridge from a spec (see the module doc). ``inprocess`` takes DeviceAgent's arguments
    (``server_url``, ``catalog``, ``packs_dir``, …, or ``agent=``); ``subprocess`` takes
    ``server_url``, ``catalog``, ``packs_dir``, ``link``, ``timeout_s``,
    ``calibration_file``, ``calibration_repeats``, ``executor``, ``reconstructor``, ``programs``."""
    s = spec.strip()
    if s == "inprocess":
        return InProcessBridge(**kw)
    if s == "subprocess":
        return SubprocessBridge(**kw)
    if s.startswith(("ws://", "wss://", "tcp://")):
        return WsBridge(s, **kw)
    if s == "adb" or s.startswith("adb:"):
        return AdbBridge(*_adb_spec(s))
    raise BridgeError(f"unknown bridge {spec!r}: use inprocess, subprocess, ws://HOST:PORT, tcp://HOST:PORT, "
                      f"adb or adb:SERIAL")
