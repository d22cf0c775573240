"""A link shaped by the kernel: a private network namespace whose loopback a token bucket (``tc`` ``tbf``)
shapes, its rate replayed from a bandwidth trace (issue #35).

Application pacing (:mod:`sakura.net.paced`, the server's trace shaping) releases bytes on a schedule;
a kernel-shaped link is what a real one looks like to TCP: a queue that fills, slow start after an idle
trough, the congestion window's ramp. Everything runs on the loopback of a namespace this process
creates and removes (``sakura-<pid>-<n>``), so no traffic leaves it; namespaces of dead processes are
swept when the next one is made. ``tbf`` refuses a rate of 0: a 0-Mbps stretch of the trace runs at
:data:`FLOOR_MBPS`. Needs root and iproute2 (``ip``, ``tc``); without them :func:`unavailable` says why.
The kernel here has no ``netem``, so the round trip stays at loopback scale.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sakura.net.traces import Trace

PREFIX = "sakura-"
FLOOR_MBPS = 0.01  # a 0-Mbps second of the trace (tbf needs a rate > 0)
MTU = 1500  # the loopback's 64 KiB MTU would let one packet carry a whole shard
# The bucket holds at most BURST_S of the rate (one packet at least: tbf drops a packet larger than its bucket).
# A trace-driven link has no credit beyond the trace's own delivery: a large bucket lets a small transfer after idle
# read many times the shaped rate, and the rate estimate then chooses levels the link cannot carry.
MIN_BURST_BYTES = 1600
BURST_S = 0.0005
LATENCY = "200ms"  # how long a packet may wait in the bucket's queue before it is dropped
_counter = itertools.count()


class KernelLinkError(RuntimeError):
    """The kernel link cannot be set up here; the message is one line and says why."""


def unavailable() -> str | None:
    """Why a kernel link cannot run on this machine (None: it can)."""
    if os.geteuid() != 0:
        return "a kernel-shaped link needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"a kernel-shaped link needs iproute2: {' and '.join(missing)} not found"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and out.returncode != 0:
        raise KernelLinkError(f"ip {' '.join(args)}: {(out.stderr or out.stdout).strip().splitlines()[-1:]}")
    return out


def namespaces() -> list[str]:
    """Names of this machine's network namespaces."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Remove the project's namespaces whose creating process is gone; returns their names."""
    swept = []
    for name in namespaces():
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) == 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
            _ip("netns", "del", name, check=False)
            swept.append(name)
    return swept


@dataclass
class Namespace:
    """A network namespace whose loopback is shaped by ``tbf``; :meth:`close` removes it."""

    name: str
    rate_mbps: float
    owned: bool = True  # close() removes it (False: another process made it and removes it)
    closed: bool = field(default=False, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # one `tc -batch` process per namespace takes the rate changes: a change lands in ~5 ms instead of the
    # 50–250 ms of starting `ip netns exec … tc` each time on a busy machine
    _tc_batch: subprocess.Popen | None = field(default=None, init=False, repr=False)

    def command(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *cmd]

    def popen(self, cmd: Sequence[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.command(cmd), **kw)

    def run(self, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(cmd), **kw)

    def set_rate(self, mbps: float, verb: str = "change") -> None:
        """The loopback's rate from now on (at least :data:`FLOOR_MBPS`); ``verb`` ``replace`` also shapes an
        unshaped loopback (:meth:`unshape`)."""
        mbps = max(float(mbps), FLOOR_MBPS)
        self._batch(" ".join(_tbf(verb, mbps)[1:]))
        self.rate_mbps = mbps

    def unshape(self) -> None:
        """No shaping until the next :meth:`set_rate` with ``replace``: what moves between edits (headers, the
        FP16 cache the quality reference is computed with) is template data outside any edit's timing."""
        self._batch("qdisc del dev lo root")
        self.rate_mbps = float("inf")

    def _batch(self, line: str) -> None:
        with self._lock:
            if self.closed:
                return
            if self._tc_batch is None or self._tc_batch.poll() is not None:
                self._tc_batch = self.popen(["tc", "-force", "-batch", "-"], stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                self._tc_batch.stdin.write(line + "\n")
                self._tc_batch.stdin.flush()
            except BrokenPipeError:
                raise KernelLinkError(f"tc in {self.name} exited: {self._tc_batch.stderr.read().strip()}") from None

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                if self._tc_batch is not None:
                    self._tc_batch.stdin.close()
                    try:
                        self._tc_batch.wait(5)
                    except subprocess.TimeoutExpired:
                        self._tc_batch.kill()
                if self.owned:
                    _ip("netns", "del", self.name, check=False)

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def burst_bytes(mbps: float) -> int:
    """The token bucket's size at ``mbps``."""
    return max(MIN_BURST_BYTES, int(mbps * 1e6 / 8 * BURST_S))


def _tbf(verb: str, mbps: float) -> list[str]:
    return ["tc", "qdisc", verb, "dev", "lo", "root", "tbf", "rate", f"{mbps * 1000:.0f}kbit", "burst",
            str(burst_bytes(mbps)), "latency", LATENCY]


def _tc(ns: str, verb: str, mbps: float) -> None:
    out = subprocess.run(["ip", "netns", "exec", ns, *_tbf(verb, mbps)], capture_output=True, text=True, timeout=20)
    if out.returncode != 0:
        raise KernelLinkError(f"tc in {ns}: {out.stderr.strip() or out.stdout.strip()}")


def create_namespace(rate_mbps: float | None) -> Namespace:
    """A new namespace shaped at ``rate_mbps`` (None: not shaped yet); stale ones of dead processes are swept first.
    Raises KernelLinkError."""
    why = unavailable()
    if why:
        raise KernelLinkError(why)
    sweep_stale()
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    _ip("netns", "add", name)
    ns = Namespace(name, float("inf") if rate_mbps is None else max(rate_mbps, FLOOR_MBPS))
    try:
        for args in (("link", "set", "lo", "mtu", str(MTU)), ("link", "set", "lo", "up")):
            _ip("netns", "exec", name, "ip", *args)
        if rate_mbps is not None:
            _tc(name, "add", ns.rate_mbps)
    except BaseException:
        ns.close()
        raise
    return ns


_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        raise KernelLinkError(f"setns: {os.strerror(ctypes.get_errno())}")


@contextlib.contextmanager
def entered(ns: Namespace):
    """The calling thread inside ``ns``'s network while in the block: the sockets it opens, the threads and the
    processes it starts meanwhile (a template server, a device agent) live on the namespace's loopback, and keep
    living there after the block. The thread's own network is restored on the way out."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns.name}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield ns
        finally:
            _setns(own)
    finally:
        os.close(own)


@dataclass(frozen=True, eq=False)  # (one per namespace: compared and hashed by identity, as a Network holds it)
class KernelLink:
    """A kernel-shaped link for edits: the namespace whose loopback carries them. During an edit its rate follows
    the edit's (scaled) trace from the edit's start; between edits the loopback is not shaped."""

    ns: Namespace

    @contextlib.contextmanager
    def replaying(self, trace: Trace, start: float):
        with TraceReplayer(self.ns, trace, start, verb="replace") as replay:
            try:
                yield replay
            finally:
                replay.stop()
                self.ns.unshape()


@contextlib.contextmanager
def kernel_link():
    """A new namespace for a command's edits (unshaped until an edit replays its trace), removed on the way out
    — also on Ctrl-C and SIGTERM, which the caller turns into an exception (:func:`terminate_as_interrupt`)."""
    ns = create_namespace(None)
    try:
        yield KernelLink(ns)
    finally:
        ns.close()


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM raises KeyboardInterrupt in the main thread while in the block, so ``finally`` clauses (removing
    the namespace) run as on Ctrl-C. Outside the main thread: nothing changes."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


LINKS = ("paced", "kernel")  # what `--link` takes: the device paces what it reads, or tc shapes a namespace


def check_link(link: str) -> None:
    """A command's ``--link`` can run here (checked before anything slow starts); else KernelLinkError, one line."""
    if link not in LINKS:
        raise KernelLinkError(f"--link must be one of {', '.join(LINKS)}, not {link!r}")
    why = unavailable() if link == "kernel" else None
    if why:
        raise KernelLinkError(f"--link kernel: {why}")


@contextlib.contextmanager
def link_for_command(link: str):
    """A command's ``--link``: None for ``paced``; for ``kernel`` a :class:`KernelLink` on a namespace this
    process creates and removes (also on Ctrl-C and SIGTERM). Raises KernelLinkError in one line."""
    check_link(link)
    if link == "paced":
        yield None
        return
    with terminate_as_interrupt(), kernel_link() as kl:
        yield kl


def attach(name: str) -> KernelLink:
    """The kernel link on namespace ``name``, made by another process of this command (which removes it): a device
    agent started inside it shapes its edits there. Raises KernelLinkError."""
    why = unavailable()
    if why:
        raise KernelLinkError(why)
    if not name.startswith(PREFIX) or name not in namespaces():
        raise KernelLinkError(f"no network namespace {name!r} made by sakura here")
    return KernelLink(Namespace(name, float("inf"), owned=False))


class TraceReplayer:
    """Sets a namespace's rate along ``trace`` from trace time ``start``, in wall time, on its own thread
    (each change lands at the trace's own edges: per-second traces change once a second)."""

    def __init__(self, ns: Namespace, trace: Trace, start: float = 0.0, verb: str = "change") -> None:
        self.ns, self.trace, self.start, self._verb = ns, trace, float(start), verb
        self.changes: list[tuple[float, float]] = []  # (seconds since t0, Mbps set)
        self.t0 = 0.0  # time.monotonic() at trace time ``start`` (the same clock in every process)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tc-replay-{ns.name}", daemon=True)

    def __enter__(self) -> TraceReplayer:
        self.t0 = time.monotonic()
        self._apply(self.trace.rate_at(self.start))
        self._thread.start()
        return self

    def _apply(self, mbps: float) -> None:
        self.ns.set_rate(mbps, self._verb)
        self._verb = "change"
        self.changes.append((time.monotonic() - self.t0, max(float(mbps), FLOOR_MBPS)))

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.start + time.monotonic() - self.t0
            rem = now % self.trace.duration
            i = int(self.trace.edges.searchsorted(rem, side="right"))
            nxt = (self.trace.edges[i] if i < len(self.trace.edges) else self.trace.duration) - rem
            if self._stop.wait(max(nxt, 0.001)):
                return
            try:
                self._apply(self.trace.rate_at(self.start + time.monotonic() - self.t0 + 1e-6))
            except KernelLinkError:
                if self.ns.closed:
                    return
                raise

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def __exit__(self, *exc: object) -> None:
        self.stop()
