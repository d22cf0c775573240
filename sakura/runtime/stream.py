"""The pipelined device runtime on the real clock: receiver → reconstructor → executor.

Three stages in four threads, bounded buffers: the receiver (a requester that decides and sends,
up to ``inflight`` requests outstanding, and a collector that waits for their bytes in order) asks
for a fetch unit once execution has started shard ``needed_by − ahead`` (so at most ``ahead`` shards wait,
received or rebuilt, beside the one executing: peak cache memory ≤ ahead+1 shards whatever the template size); the
reconstructor rebuilds in arrival order (anytime: when execution reaches a shard still in flight,
the collector stops at the best configuration that came through — a pack's configurations arrive
smallest first — and the rest of that transfer is dropped); the executor is the model's own masked run, whose provider
callback blocks until the shard it asks for is rebuilt and releases each K/V as soon as it is
consumed. Every step is recorded on the edit's :class:`Timeline` (which emits it as an event).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from sakura.formats import ChunkChecksumError, StreamEncoding
from sakura.kvcache import shard_of_layers
from sakura.model import DiTAdapter, EditRequest, EditResult, LocalSwitch
from sakura.net.paced import DEFAULT_INFLIGHT
from sakura.online.deadline import predict_need
from sakura.online.fallback import (
    CHECK_EVERY_S,
    FallbackContext,
    choose_fallback,
    mean_or_none,
    observed_rate_bps,
    predict_ready,
)
from sakura.online.monitor import DEFAULT_ESTIMATOR, RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.errors import StreamError
from sakura.runtime.prefetch import Prefetched
from sakura.runtime.timeline import Timeline, UnitRecord


class Link(Protocol):
    """A paced link (:class:`sakura.net.paced.PacedLink`): ``send`` books a request, ``receive`` waits for it."""

    def send(self, file_id: str, ranges): ...

    def receive(self, pending, cut=None, prefix_ends=(), drop=None): ...

    def progress(self, pending, need_bytes: int = 0): ...


@dataclass
class StreamState:
    """What the three threads of one streamed edit share."""

    t0: float
    starts: list[float | None]  # per shard: when execution started it
    ready: list[threading.Event]  # per shard: all its fetch units are rebuilt
    started: list[threading.Event]  # per shard: execution started (gates the receiver)
    pending_units: list[int]  # per shard: fetch units not yet rebuilt
    cut: list[threading.Event]  # per shard: execution reached it first (anytime: use what arrived)
    drop: list[threading.Event]  # per shard: a fallback replaced it (its transfers stop, its bytes go unused)
    kv: dict = field(default_factory=dict)
    flights: dict = field(default_factory=dict)  # per shard: [(pending transfer, bytes of its smallest prefix)]
    kept: dict = field(default_factory=dict)  # per shard: the compressed bytes it was rebuilt from (one step kept)
    rebuild_s: dict = field(default_factory=dict)  # per shard: its measured rebuild time
    kv_error: dict = field(default_factory=dict)  # per shard: the error its K/V were rebuilt at (None: unknown)
    error: BaseException | None = None
    held_bytes: int = 0
    peak_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def hold(self, n: int) -> None:
        with self.lock:
            self.held_bytes += n
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def fail(self, e: BaseException) -> None:
        self.error = e
        for ev in self.ready + self.started:
            ev.set()


class StreamedEdit:
    def __init__(self, adapter: DiTAdapter, encoding: StreamEncoding, policy: Policy, link: Link,
                 file_id: str, compute: ComputeProfile, initial_bps: float, ahead: int = 2,
                 timeout_s: float = 120.0, executor=None, inflight: int = DEFAULT_INFLIGHT,
                 estimator: str = DEFAULT_ESTIMATOR, anytime: bool = True,
                 fallback: FallbackContext | None = None, prefetched: Prefetched | None = None):
        self.fallback = fallback  # None: always wait for the cache (the paper's runtime)
        self.prefetched = prefetched
        self.on_device = prefetched.units if prefetched is not None else {}  # fetched when the template was picked
        self.adapter, self.encoding, self.policy, self.link = adapter, encoding.fresh(), policy, link
        self.file_id, self.compute, self.ahead, self.timeout_s = file_id, compute, ahead, timeout_s
        self.inflight, self.anytime = inflight, anytime
        self.monitor = RuntimeMonitor(initial_bps, estimator=estimator)
        self.executor = executor  # None: the adapter's eager masked run; else e.g. an ExecuTorch executor
        self._per_step = sum(1 for s, _, _ in compute.shards if s == compute.shards[0][0])

    def run(self, req: EditRequest, timeline: Timeline) -> EditResult:
        """Stream, rebuild and execute; ``timeline`` (over the compute profile's shards) is filled in."""
        self._req = req  # (the recompute fallback computes the template's own step 0 from it)
        shards = self.compute.shards
        n = len(shards)
        state = StreamState(time.perf_counter(), [None] * n, [threading.Event() for _ in range(n)],
                            [threading.Event() for _ in range(n)],
                            [sum(1 for u in self.encoding.units if u.needed_by == j) for j in range(n)],
                            [threading.Event() for _ in range(n)], [threading.Event() for _ in range(n)])
        self.policy.begin(self.encoding.units, self.compute.masked_s, self.monitor.initial_bps)
        if self.prefetched is not None:
            timeline.extras["prefetched"] = self.prefetched.summary()
        rebuild_q: queue.Queue = queue.Queue(maxsize=self.ahead + 1)
        sent: queue.Queue = queue.Queue()
        slots = threading.Semaphore(self.inflight)
        threads = [threading.Thread(target=self._request, args=(state, timeline, sent, slots), name="requester"),
                   threading.Thread(target=self._collect, args=(state, timeline, sent, slots, rebuild_q),
                                    name="collector"),
                   threading.Thread(target=self._rebuild, args=(state, timeline, rebuild_q), name="rebuild")]
        for t in threads:
            t.daemon = True
            t.start()
        shard_of = shard_of_layers(shards)

        def provider(step, layer):
            return self._provide(state, timeline, shard_of[(step, layer)], step, layer)

        try:
            if self.executor is None:
                result = self.adapter.masked_edit(req, provider)
            else:  # shard-by-shard programs (sakura.runtime.executors) over the same blocking provider
                result = self.executor.run_masked_edit(req, provider, shards[0][2] - shards[0][1])
        finally:
            end = state.now()
            if state.error is None:
                state.error = StreamError("edit ended")  # stops the helper threads
            for ev in state.started:
                ev.set()
            if hasattr(self.link, "close"):  # a transfer still being paced gives up at once
                self.link.close()
            for t in threads:
                t.join(timeout=10)
        if timeline.shards and "local_from_step" not in timeline.extras:
            timeline.shard_ended(n - 1, end)
        for rec in timeline.units:
            rec.needed_t = state.starts[rec.needed_by] or 0.0
        timeline.latency_s = end
        timeline.bytes_total = sum(u.nbytes for u in timeline.units)
        timeline.peak_cache_bytes = state.peak_bytes
        return result

    # -- executor side (called from inside the model's masked run) -------------------------------
    def _provide(self, state: StreamState, timeline: Timeline, j: int, step: int, layer: int):
        if state.starts[j] is None:
            asked = state.now()
            if j > 0:
                timeline.shard_ended(j - 1, asked)
            if self.anytime and not state.ready[j].is_set():
                state.cut[j].set()  # use what has arrived (see _collect)
            if not self._wait_for(state, timeline, j, step, asked):
                state.fail(StreamError(f"cache shard {j} did not arrive within {self.timeout_s:.0f} s"))
            if state.pending_units[j] != 0 and not state.drop[j].is_set():  # woken by a failure, not by the shard
                raise StreamError(str(state.error))
            start = state.now()
            state.starts[j] = start
            state.started[j].set()
            timeline.shard_started(j, start, start - asked)
        k, v = state.kv.pop((step, layer))
        state.hold(-(k.nbytes + v.nbytes))
        return k, v

    def _wait_for(self, state: StreamState, timeline: Timeline, j: int, step: int, asked: float) -> bool:
        """Wait for shard ``j``'s cache, or fall back (:mod:`sakura.online.fallback`); False on timeout."""
        fb = self.fallback
        if fb is None:
            return state.ready[j].wait(self.timeout_s)
        prev = j - self._per_step
        while not state.ready[j].wait(CHECK_EVERY_S):
            now = state.now()
            if state.error is not None or now - asked > self.timeout_s:
                return state.ready[j].is_set()
            flights = [self.link.progress(p, need) for p, need in state.flights.get(j, [])]
            if not any(f.delivered < f.need_bytes for f in flights):
                continue  # its bytes are here (or on the device): only a rebuild is left, as the sim clock has it
            times = list(state.rebuild_s.values())
            ready = predict_ready(now, flights, self.monitor.rate_bps, sum(times) / max(1, len(times)))
            kept = state.kept.get(prev) if prev >= 0 else None
            kind, ends = choose_fallback(fb, j, now, ready, state.rebuild_s.get(prev) if kept else None,
                                         observed_rate_bps(self.monitor.rate_bps, flights), state.kv_error.get(prev))
            if kind == "wait":
                continue
            state.drop[j].set()
            timeline.fallback(kind, j, now, ends)
            if kind == "recompute":
                self._recompute(state, j)
                return True
            if kind == "local":
                timeline.extras["local_from_step"] = step
                for later in state.drop[j:]:  # no later shard needs its cache: every transfer is dropped
                    later.set()
                state.fail(StreamError("the edit went local"))  # stops the receiver: no more cache needed
                if hasattr(self.link, "close"):
                    self.link.close()
                raise LocalSwitch
            self._reuse(state, j, prev, kept)
            return True
        return True

    def _recompute(self, state: StreamState, j: int) -> None:
        """The device computes step 0's K/V itself (one full forward of the template's own request): shard
        ``j`` and the rest of step 0 need no transfer."""
        mine = [i for i in range(j, len(self.compute.shards)) if self.compute.shards[i][0] == 0]
        for i in mine:
            state.drop[i].set()  # their transfers stop; the requester skips what it has not sent
        kv = self.adapter.recompute_first_step(self._req)
        for i in mine:
            _, l0, l1 = self.compute.shards[i]
            for layer in range(l0, l1):
                k, v = kv[(0, layer)]
                state.kv[(0, layer)] = (k, v)
                state.hold(k.nbytes + v.nbytes)
            state.kv_error[i] = 0.0  # exact K/V
            state.ready[i].set()

    def _reuse(self, state: StreamState, j: int, prev: int, kept: list) -> None:
        """Shard ``j`` runs on its layers' K/V of one step earlier, rebuilt from the kept bytes."""
        t0 = time.perf_counter()
        step = self.compute.shards[j][0]
        for unit, level, ranges, parts, whole in kept:
            kv = (self.encoding.decode(unit, level, parts) if whole else
                  self.encoding.decode_prefix(unit, level, ranges, parts))
            for (s, layer), pair in kv.items():
                state.kv[(step, layer)] = pair
                state.hold(pair[0].nbytes + pair[1].nbytes)
        state.kept[j], state.rebuild_s[j] = kept, time.perf_counter() - t0
        state.kv_error[j] = self.fallback.reuse_error(j, state.kv_error.get(prev))

    # -- receiver: a requester that decides and sends, a collector that waits for the bytes ----------
    def _request(self, state: StreamState, timeline: Timeline, sent: queue.Queue, slots: threading.Semaphore) -> None:
        """Decide and send each fetch unit in order, at most ``inflight`` outstanding."""
        try:
            for unit in self.encoding.units:
                gate = unit.needed_by - self.ahead
                if gate >= 0:
                    state.started[gate].wait()
                while not slots.acquire(timeout=0.05):
                    if state.error is not None:
                        return
                if state.error is not None:
                    return
                if state.drop[unit.needed_by].is_set():  # a fallback already gave its shard a cache
                    slots.release()
                    continue
                now = state.now()
                unit = self.encoding.priced(unit)
                deadline = predict_need(unit.needed_by, now, self.compute, state.starts)
                d = self.policy.choose(unit, now, deadline, self.monitor)
                on_device = self.on_device.get(unit.index)
                if on_device is not None and d.level.error >= on_device.level.error:  # nothing better: no request
                    slots.release()
                    rec = UnitRecord(unit.index, unit.needed_by, unit.label, on_device.level.label, 0, d.budget_bytes,
                                     d.window_s, d.rate_bps / 1e6, True, now, deadline_t=deadline, prefetched=True)
                    timeline.requested(rec)
                    sent.put((unit, on_device.level, on_device.ranges, None, rec, None, on_device))
                    continue
                ranges = self.encoding.ranges(unit, d.level)
                rec = UnitRecord(unit.index, unit.needed_by, unit.label, d.level.label, sum(n for _, n in ranges),
                                 d.budget_bytes, d.window_s, d.rate_bps / 1e6, d.fits, now, deadline_t=deadline,
                                 ranges=len(ranges))
                timeline.requested(rec)
                prefixes = self.encoding.prefixes(unit, d.level, ranges) if self.anytime else [(d.level, len(ranges))]
                pending = self.link.send(self.file_id, ranges)
                if on_device is None:  # (a unit with a prefetched floor never waits on the link)
                    state.flights.setdefault(unit.needed_by, []).append(
                        (pending, sum(n for _, n in ranges[:prefixes[0][1]])))
                sent.put((unit, d.level, ranges, prefixes, rec, pending, on_device))
        except BaseException as e:  # noqa: BLE001 - handed to the executor, which raises it
            state.fail(StreamError(f"receiving the cache failed: {e}"))
        finally:
            sent.put(None)

    def _collect(self, state: StreamState, timeline: Timeline, sent: queue.Queue, slots: threading.Semaphore,
                 out: queue.Queue) -> None:
        """Wait for each sent request's bytes, in order; feed the monitor and the reconstructor."""
        try:
            while (item := sent.get()) is not None:
                unit, level, ranges, prefixes, rec, pending, on_device = item
                if state.error is not None:  # drain, so the requester never blocks
                    if pending is not None and state.drop[unit.needed_by].is_set():  # the edit went local
                        timeline.dropped(rec, self.link.receive(pending, drop=state.drop[unit.needed_by]).nbytes,
                                         state.now())
                    continue
                if on_device is not None:
                    self._from_device(state, timeline, slots, out, item)
                    continue
                tr = self.link.receive(pending, state.cut[unit.needed_by], [k for _, k in prefixes],
                                       state.drop[unit.needed_by])
                if state.drop[unit.needed_by].is_set():  # a fallback replaced the unit
                    self.monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
                    slots.release()
                    timeline.dropped(rec, tr.nbytes, state.now())
                    continue
                whole = len(tr.parts) == len(ranges)
                if not whole:  # execution reached the unit first: its best prefix
                    level, ranges = next(lv for lv, k in prefixes if k == len(tr.parts)), ranges[:len(tr.parts)]
                    timeline.cut(rec, level.label, tr.nbytes, state.now())
                active = self.monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
                slots.release()
                state.hold(tr.nbytes)
                timeline.arrived(rec, state.now(), active, ranges)
                out.put((unit, level, ranges, tr.parts, rec, whole))
        except BaseException as e:  # noqa: BLE001 - handed to the executor, which raises it
            state.fail(StreamError(f"receiving the cache failed: {e}"))
            while sent.get() is not None:  # let the requester finish
                pass
        finally:
            out.put(None)

    def _from_device(self, state: StreamState, timeline: Timeline, slots: threading.Semaphore, out: queue.Queue,
                     item) -> None:
        """A unit with prefetched bytes: nothing to receive, or an upgrade that is used only if it comes
        before execution needs the unit (else the prefetched level)."""
        unit, level, ranges, prefixes, rec, pending, on_device = item
        if pending is not None:
            tr = self.link.receive(pending, drop=state.cut[unit.needed_by])
            if len(tr.parts) == len(ranges):
                active = self.monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
                slots.release()
                state.hold(tr.nbytes)
                timeline.arrived(rec, state.now(), active, ranges)
                out.put((unit, level, ranges, tr.parts, rec, True))
                return
            self.monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
            slots.release()
            timeline.dropped(rec, tr.nbytes, state.now(), on_device.level.label)
        else:
            timeline.arrived(rec, state.now(), 0.0, on_device.ranges)
        state.hold(on_device.nbytes)
        out.put((unit, on_device.level, on_device.ranges, on_device.parts, rec, True))

    # -- reconstructor -----------------------------------------------------------------------------
    def _refetch(self, ranges, reason: str) -> list[bytes]:
        """The bytes of ``ranges`` once more, over the same paced link; a source with replicas is told to
        use the next one (:meth:`sakura.net.failover.FailoverSource.avoid`)."""
        avoid = getattr(getattr(self.link, "inner", None), "avoid", None)
        if avoid is not None:
            avoid(self.file_id, reason)
        return self.link.receive(self.link.send(self.file_id, ranges)).parts

    def _rebuild(self, state: StreamState, timeline: Timeline, inbox: queue.Queue) -> None:
        while (item := inbox.get()) is not None:
            if state.error is not None:
                continue  # drain, so the receiver never blocks on a full queue
            unit, level, ranges, parts, rec, whole = item
            j = unit.needed_by
            if state.drop[j].is_set():  # a fallback replaced the shard while its bytes waited here
                state.hold(-sum(len(p) for p in parts))
                continue
            try:
                t0 = time.perf_counter()
                try:
                    kv = (self.encoding.decode(unit, level, parts) if whole else
                          self.encoding.decode_prefix(unit, level, ranges, parts))
                except ChunkChecksumError as e:  # damaged bytes: fetch them once more (another source if any)
                    parts = self._refetch(ranges, str(e))
                    t0 = time.perf_counter()
                    kv = (self.encoding.decode(unit, level, parts) if whole else
                          self.encoding.decode_prefix(unit, level, ranges, parts))
                took = time.perf_counter() - t0
                state.rebuild_s[j] = state.rebuild_s.get(j, 0.0) + took
                self.monitor.rebuild.observe(level.work, took)
                if self.encoding.redecodable:
                    state.kept.setdefault(j, []).append((unit, level, ranges, parts, whole))
                    state.kv_error[j] = mean_or_none([lv.error for _, lv, *_ in state.kept[j]])
                state.kept.pop(j - 2 * self._per_step, None)  # compressed bytes of one step back are enough
            except Exception as e:  # noqa: BLE001 - malformed bytes: the executor raises it
                state.fail(StreamError(f"rebuilding fetch unit {unit.index} failed: {e}"))
                continue
            state.hold(sum(k.nbytes + v.nbytes for k, v in kv.values()) - sum(len(p) for p in parts))
            state.kv.update(kv)
            timeline.rebuilt(rec, state.now())
            state.pending_units[unit.needed_by] -= 1
            if state.pending_units[unit.needed_by] == 0:
                state.ready[unit.needed_by].set()
