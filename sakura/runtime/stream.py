"""The pipelined device runtime on the real clock: receiver → reconstructor → executor.

Three threads of work, bounded buffers: the receiver asks for unit p once execution has started
shard ``needed_by(p) − ahead`` (so at most ``ahead`` shards wait, received or rebuilt, beside the one
executing: peak cache memory ≤ ahead+1 shards whatever the template size); the reconstructor
rebuilds in arrival order; the executor is the model's own masked run, whose provider callback
blocks until the shard it asks for is rebuilt and releases each K/V as soon as it is consumed.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from sakura.model import DiTAdapter, EditRequest, EditResult
from sakura.online.encoding import StreamEncoding
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.sim import predict_need
from sakura.runtime.timeline import ShardRecord, Timeline, UnitRecord


class StreamError(RuntimeError):
    """The cache stream failed (link error, malformed bytes, timeout); the message is one line."""


class Link(Protocol):
    def fetch_timed(self, file_id: str, ranges): ...


@dataclass
class _Shared:
    t0: float
    starts: list[float | None]
    ready: list[threading.Event]
    started: list[threading.Event]
    kv: dict = field(default_factory=dict)
    pending_units: list[int] = field(default_factory=list)  # per shard: units not yet rebuilt
    error: BaseException | None = None
    held_bytes: int = 0
    peak_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, n: int) -> None:
        with self.lock:
            self.held_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def fail(self, e: BaseException) -> None:
        self.error = e
        for ev in self.ready + self.started:
            ev.set()


def read_header(link: Link, file_id: str) -> bytes:
    """The raw ``8 + N`` header bytes of a stored file, by two small range requests."""
    first8 = link.fetch_timed(file_id, [(0, 8)]).parts[0]
    n = int.from_bytes(first8, "little")
    if not 0 < n < (16 << 20):
        raise StreamError(f"{file_id}: not a SAKURA container (header length {n})")
    return first8 + link.fetch_timed(file_id, [(8, n)]).parts[0]


class StreamedEdit:
    def __init__(self, adapter: DiTAdapter, encoding: StreamEncoding, policy: Policy, link: Link,
                 file_id: str, compute: ComputeProfile, initial_bps: float, ahead: int = 2,
                 timeout_s: float = 120.0, on_event: Callable[[str, dict], None] | None = None,
                 executor=None):
        self.adapter, self.encoding, self.policy, self.link = adapter, encoding.fresh(), policy, link
        self.file_id, self.compute, self.ahead, self.timeout_s = file_id, compute, ahead, timeout_s
        self.monitor = RuntimeMonitor(initial_bps)
        self.on_event = on_event or (lambda kind, data: None)
        self.executor = executor  # None: the adapter's eager masked run; else e.g. an ExecuTorch executor

    def run(self, req: EditRequest) -> tuple[EditResult, Timeline]:
        shards = self.compute.shards
        n = len(shards)
        sh = _Shared(time.perf_counter(), [None] * n, [threading.Event() for _ in range(n)],
                     [threading.Event() for _ in range(n)])
        sh.pending_units = [sum(1 for u in self.encoding.units if u.needed_by == j) for j in range(n)]
        tl = Timeline(self.policy.name, "real")
        tl.shards = [ShardRecord(j, s, (a, b)) for j, (s, a, b) in enumerate(shards)]
        self.policy.begin(self.encoding.units, self.compute.masked_s, self.monitor.initial_bps)
        rebuild_q: queue.Queue = queue.Queue(maxsize=self.ahead + 1)
        receiver = threading.Thread(target=self._receive, args=(sh, tl, rebuild_q), daemon=True, name="receiver")
        rebuilder = threading.Thread(target=self._rebuild, args=(sh, tl, rebuild_q), daemon=True, name="rebuild")
        receiver.start()
        rebuilder.start()
        shard_of = {(s, layer): j for j, (s, a, b) in enumerate(shards) for layer in range(a, b)}
        last_layer = {j: (s, b - 1) for j, (s, a, b) in enumerate(shards)}
        def provider(s, l):
            return self._provide(sh, tl, shard_of[(s, l)], s, l, last_layer)

        try:
            if self.executor is None:
                result = self.adapter.masked_edit(req, provider)
            else:  # shard-by-shard programs (sakura.runtime.executors) over the same blocking provider
                result = self.executor.run_masked_edit(req, provider, shards[0][2] - shards[0][1])
        finally:
            if sh.error is None:
                sh.error = StreamError("edit ended")  # stops the helper threads
            for ev in sh.started:
                ev.set()
        end = time.perf_counter() - sh.t0
        if tl.shards:
            tl.shards[-1].exec_end_t = end
            self.on_event("shard_end", {"shard": len(tl.shards) - 1, "t": end})
        for rec in tl.units:
            rec.needed_t = sh.starts[rec.needed_by] or 0.0
        tl.latency_s = end
        tl.bytes_total = sum(u.nbytes for u in tl.units) + tl.extras.get("preamble_bytes", 0)
        tl.peak_cache_bytes = sh.peak_bytes
        receiver.join(timeout=5)
        rebuilder.join(timeout=5)
        return result, tl

    # -- executor side (called from inside the model's masked run) -------------------------------
    def _provide(self, sh: _Shared, tl: Timeline, j: int, step: int, layer: int, last_layer):
        if sh.starts[j] is None:
            now = time.perf_counter() - sh.t0
            if j > 0:
                tl.shards[j - 1].exec_end_t = now
                self.on_event("shard_end", {"shard": j - 1, "t": now})
            if not sh.ready[j].wait(self.timeout_s):
                sh.fail(StreamError(f"cache shard {j} did not arrive within {self.timeout_s:.0f} s"))
            if sh.pending_units[j] != 0:  # woken by a failure, not by the shard
                raise StreamError(str(sh.error))
            start = time.perf_counter() - sh.t0
            sh.starts[j] = start
            tl.shards[j].exec_start_t = start
            tl.shards[j].stall_s = start - now
            sh.started[j].set()
            self.on_event("shard_start", {"shard": j, "t": start, "stall_s": start - now})
        k, v = sh.kv.pop((step, layer))
        sh.hold(-(k.nbytes + v.nbytes))
        return k, v

    # -- receiver ----------------------------------------------------------------------------------
    def _receive(self, sh: _Shared, tl: Timeline, out: queue.Queue) -> None:
        try:
            pre = self.encoding.preamble_ranges()
            if pre:
                tr = self.link.fetch_timed(self.file_id, pre)
                self.monitor.record_transfer(tr.nbytes, tr.active_s)
                self.encoding.set_preamble(tr.parts)
                tl.extras["preamble_bytes"] = tr.nbytes
            for u in self.encoding.units:
                gate = u.needed_by - self.ahead
                if gate >= 0:
                    sh.started[gate].wait()
                if sh.error is not None:
                    return
                now = time.perf_counter() - sh.t0
                deadline = predict_need(u.needed_by, now, self.compute, sh.starts)
                d = self.policy.choose(u, now, deadline, self.monitor)
                ranges = self.encoding.ranges(u, d.level)
                self.on_event("request", {"unit": u.index, "shard": u.needed_by, "label": u.label,
                                          "level": d.level.label, "bytes": d.level.nbytes, "t": now,
                                          "deadline": deadline, "budget_bytes": d.budget_bytes,
                                          "window_s": d.window_s, "rate_mbps": d.rate_bps / 1e6, "fits": d.fits})
                tr = self.link.fetch_timed(self.file_id, ranges)
                self.monitor.record_transfer(tr.nbytes, tr.active_s)
                arrival = time.perf_counter() - sh.t0
                sh.hold(tr.nbytes)
                rec = UnitRecord(u.index, u.needed_by, u.label, d.level.label, d.level.nbytes, d.budget_bytes,
                                 d.window_s, d.rate_bps / 1e6, d.fits, now, arrival, 0.0, deadline,
                                 ranges=len(ranges))
                tl.units.append(rec)
                self.on_event("arrival", {"unit": u.index, "shard": u.needed_by, "level": d.level.label,
                                          "bytes": d.level.nbytes, "t": arrival, "deadline": deadline,
                                          "active_s": tr.active_s, "ranges": [list(r) for r in ranges]})
                out.put((u, d.level, tr.parts, rec))
        except BaseException as e:  # noqa: BLE001 - handed to the executor, which raises it
            sh.fail(StreamError(f"receiving the cache failed: {e}"))
        finally:
            out.put(None)

    # -- reconstructor -----------------------------------------------------------------------------
    def _rebuild(self, sh: _Shared, tl: Timeline, inbox: queue.Queue) -> None:
        while (item := inbox.get()) is not None:
            if sh.error is not None:
                continue  # drain, so the receiver never blocks on a full queue
            u, level, parts, rec = item
            try:
                kv = self.encoding.decode(u, level, parts)
            except Exception as e:  # noqa: BLE001 - malformed bytes: the executor raises it
                sh.fail(StreamError(f"rebuilding unit {u.index} failed: {e}"))
                continue
            sh.hold(sum(k.nbytes + v.nbytes for k, v in kv.values()) - sum(len(p) for p in parts))
            sh.kv.update(kv)
            rec.rebuild_done_t = time.perf_counter() - sh.t0
            self.on_event("rebuilt", {"unit": u.index, "shard": u.needed_by, "t": rec.rebuild_done_t})
            sh.pending_units[u.needed_by] -= 1
            if sh.pending_units[u.needed_by] == 0:
                sh.ready[u.needed_by].set()
