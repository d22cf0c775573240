"""The pipelined device runtime on the real clock: receiver → reconstructor → executor.

Three stages in four threads, bounded buffers: the receiver (a requester that decides and sends,
up to ``inflight`` requests outstanding, and a collector that waits for their bytes in order) asks
for a fetch unit once execution has started shard ``needed_by − ahead`` (so at most ``ahead`` shards wait,
received or rebuilt, beside the one executing: peak cache memory ≤ ahead+1 shards whatever the template size); the
reconstructor rebuilds in arrival order (anytime: when execution reaches a shard still in flight,
the collector stops at the best configuration that came through — a pack's configurations arrive
smallest first — and the rest of that transfer is dropped); the executor is the model's own masked run, whose provider
callback blocks until the shard it asks for is rebuilt and releases each K/V as soon as it is
consumed. Every decision is the scheduler's (:mod:`sakura.runtime.scheduler`, as on the simulated
clock): these threads carry out what it answers and tell it what happened. Every step is recorded on the
edit's :class:`Timeline` (which emits it as an event).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from sakura.formats import ChunkChecksumError, FetchUnit, Level, Range, StreamEncoding
from sakura.kvcache import shard_of_layers
from sakura.model import DiTAdapter, EditRequest, EditResult, LocalSwitch
from sakura.net.paced import DEFAULT_INFLIGHT
from sakura.online.fallback import CHECK_EVERY_S, FallbackContext
from sakura.online.monitor import DEFAULT_ESTIMATOR, RuntimeMonitor
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.errors import StreamError
from sakura.runtime.prefetch import Prefetched
from sakura.runtime.scheduler import WAIT, FallbackChoice, Fetch, StreamScheduler, UseHeld
from sakura.runtime.timeline import Timeline, UnitRecord


class Link(Protocol):
    """A paced link (:class:`sakura.net.paced.PacedLink`): ``send`` books a request, ``receive`` waits for it."""

    def send(self, file_id: str, ranges): ...

    def receive(self, pending, cut=None, prefix_ends=(), drop=None): ...

    def progress(self, pending, need_bytes: int = 0): ...


@dataclass
class Sent:
    """What the requester hands the collector: the scheduler's action and the link's handle (None: nothing
    was sent, the prefetched bytes serve)."""

    action: Fetch | UseHeld
    pending: object | None


@dataclass
class Received:
    """Bytes on the device, waiting for the reconstructor: ``parts`` of ``ranges`` make ``level`` (all of
    them: ``whole``; else the leading prefix execution cut the transfer at)."""

    unit: FetchUnit
    level: Level
    ranges: list[Range]
    parts: list[bytes]
    record: UnitRecord
    whole: bool

    def decode(self, encoding: StreamEncoding):
        return (encoding.decode(self.unit, self.level, self.parts) if self.whole else
                encoding.decode_prefix(self.unit, self.level, self.ranges, self.parts))


@dataclass
class StreamState:
    """What the threads of one streamed edit share (the decisions' state is the scheduler's)."""

    t0: float
    ready: list[threading.Event]  # per shard: its cache is on the device (rebuilt, or a fallback's)
    started: list[threading.Event]  # per shard: execution started (gates the receiver)
    cut: list[threading.Event]  # per shard: execution reached it first (anytime: use what arrived)
    drop: list[threading.Event]  # per shard: a fallback replaced it (its transfers stop, its bytes go unused)
    kv: dict = field(default_factory=dict)
    # per shard: [(pending transfer, bytes of its smallest prefix, bytes of all of it)]
    flights: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)  # per shard: the Received it was rebuilt from, until its next step starts
    error: BaseException | None = None
    held_bytes: int = 0
    peak_bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_shards(cls, n: int) -> "StreamState":
        def events():
            return [threading.Event() for _ in range(n)]

        return cls(time.perf_counter(), events(), events(), events(), events())

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
                 fallback: FallbackContext | None = None, prefetched: Prefetched | None = None,
                 initial_round_trip_s: float = 0.0, rebuild_prior_s_per_work: float = 0.0):
        self.fallback = fallback  # None: always wait for the cache (the paper's runtime)
        self.prefetched = prefetched
        self.adapter, self.encoding, self.link = adapter, encoding.fresh(), link
        self.file_id, self.compute, self.ahead, self.timeout_s = file_id, compute, ahead, timeout_s
        self.inflight = inflight
        self.monitor = RuntimeMonitor(initial_bps, estimator=estimator, initial_round_trip_s=initial_round_trip_s,
                                      rebuild_prior_s_per_work=rebuild_prior_s_per_work)
        self.sched = StreamScheduler(self.encoding, policy, compute, self.monitor, ahead, anytime, fallback,
                                     prefetched.units if prefetched is not None else None)
        self.executor = executor  # None: the adapter's eager masked run; else e.g. an ExecuTorch executor

    def run(self, req: EditRequest, timeline: Timeline) -> EditResult:
        """Stream, rebuild and execute; ``timeline`` (over the compute profile's shards) is filled in."""
        self._req = req  # (the recompute fallback computes the template's own step 0 from it)
        shards = self.compute.shards
        n = len(shards)
        state = StreamState.for_shards(n)
        self.sched.begin()
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
        self._state, self._timeline, self._shard_of = state, timeline, shard_of_layers(shards)
        try:
            if self.executor is None:
                result = self.adapter.masked_edit(req, self.provide)
            else:  # shard-by-shard programs (sakura.runtime.executors) over the same blocking provider
                result = self.executor.run_masked_edit(req, self.provide, shards[0][2] - shards[0][1])
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
            rec.needed_t = self.sched.starts[rec.needed_by] or 0.0
        timeline.latency_s = end
        timeline.bytes_total = sum(u.nbytes for u in timeline.units)
        timeline.peak_cache_bytes = state.peak_bytes
        return result

    # -- executor side (called from inside the model's masked run) -------------------------------
    def provide(self, step: int, layer: int):
        """The model's K/V provider: blocks until the shard of (``step``, ``layer``) is rebuilt (or a fallback
        gave it a cache), and releases each K/V as soon as it is consumed."""
        state, timeline, j = self._state, self._timeline, self._shard_of[(step, layer)]
        if self.sched.starts[j] is None:
            asked = state.now()
            if j > 0:
                timeline.shard_ended(j - 1, asked)
            # shard 0's bytes were chosen to come by the start-up deadline: it is cut no earlier (fallbacks still look)
            cut_at = self.sched.startup_until if j == 0 else asked
            if not self._wait_for(state, timeline, j, asked, cut_at if self.sched.anytime else None):
                state.fail(StreamError(f"cache shard {j} did not arrive within {self.timeout_s:.0f} s"))
            if not self.sched.ready(j):  # woken by a failure, not by the shard
                raise StreamError(str(state.error))
            start = state.now()
            self.sched.shard_started(j, start)
            state.kept.pop(j - self.sched.per_step, None)  # only shard j could have reused those bytes
            state.started[j].set()
            timeline.shard_started(j, start, start - asked)
        k, v = state.kv.pop((step, layer))
        state.hold(-(k.nbytes + v.nbytes))
        return k, v

    def _wait_for(self, state: StreamState, timeline: Timeline, j: int, asked: float,
                  cut_at: float | None = None) -> bool:
        """Wait for shard ``j``'s cache, asking the scheduler every ``CHECK_EVERY_S`` whether to fall back, and
        cutting its transfers at ``cut_at`` if they are still going (None: never; when it is due the scheduler may
        move it a moment later, :meth:`StreamScheduler.cut_at`); False on timeout."""
        decided = False

        def cut_due() -> bool:
            return cut_at is not None and not state.cut[j].is_set() and not state.ready[j].is_set()

        def cut_if_due(now: float) -> None:
            nonlocal cut_at, decided
            if not cut_due() or now < cut_at:
                return
            if not decided:
                decided = True
                cut_at = self.sched.cut_at(j, now, self._remaining_bytes(state, j))
                if cut_at > now:
                    return
            state.cut[j].set()  # use what has arrived (see _collect)

        cut_if_due(state.now())
        if self.fallback is None:
            while cut_due() and not state.ready[j].wait(max(0.0, cut_at - state.now())):
                cut_if_due(state.now())
            return state.ready[j].wait(self.timeout_s)
        while not state.ready[j].wait(min(CHECK_EVERY_S, max(0.0, cut_at - state.now())) if cut_due()
                                      else CHECK_EVERY_S):
            now = state.now()
            cut_if_due(now)
            if state.error is not None or now - asked > self.timeout_s:
                return state.ready[j].is_set()
            flights = [self.link.progress(p, need) for p, need, _ in state.flights.get(j, [])]
            choice = self.sched.waiting(j, now, flights)
            if choice.kind == WAIT:
                continue
            for i in choice.shards:  # their transfers stop; the requester skips what it has not sent
                state.drop[i].set()
            timeline.fallback(choice.kind, j, now, choice.ends)
            if choice.kind == "local":
                timeline.extras["local_from_step"] = choice.local_from_step
                state.fail(StreamError("the edit went local"))  # stops the receiver: no more cache needed
                if hasattr(self.link, "close"):
                    self.link.close()
                raise LocalSwitch
            if choice.kind == "recompute":
                self._recompute(state, choice)
            else:
                self._reuse(state, j, choice.reuse_from)
            return True
        return True

    def _remaining_bytes(self, state: StreamState, j: int) -> float:
        """Bytes of shard ``j``'s transfers not through yet, as the device sees them."""
        return sum(max(0.0, total - self.link.progress(p).delivered) for p, _, total in state.flights.get(j, []))

    def _recompute(self, state: StreamState, choice: FallbackChoice) -> None:
        """The device computes step 0's K/V itself (one full forward of the template's own request): the
        shards of the choice need no transfer."""
        kv = self.adapter.recompute_first_step(self._req)
        for i in choice.shards:
            _, l0, l1 = self.compute.shards[i]
            for layer in range(l0, l1):
                k, v = kv[(0, layer)]
                state.kv[(0, layer)] = (k, v)
                state.hold(k.nbytes + v.nbytes)
            state.ready[i].set()

    def _reuse(self, state: StreamState, j: int, prev: int) -> None:
        """Shard ``j`` runs on its layers' K/V of one step earlier, rebuilt from the kept bytes."""
        step = self.compute.shards[j][0]
        kept = state.kept[prev]
        for got in kept:
            for (_, layer), pair in got.decode(self.encoding).items():
                state.kv[(step, layer)] = pair
                state.hold(pair[0].nbytes + pair[1].nbytes)
        state.kept[j] = kept

    # -- receiver: a requester that asks and sends, a collector that waits for the bytes -----------
    def _request(self, state: StreamState, timeline: Timeline, sent: queue.Queue, slots: threading.Semaphore) -> None:
        """Ask for each fetch unit in order, at most ``inflight`` outstanding."""
        try:
            for unit in self.encoding.units:
                gate = self.sched.gate(unit)
                if gate is not None:
                    state.started[gate].wait()
                while not slots.acquire(timeout=0.05):
                    if state.error is not None:
                        return
                if state.error is not None:
                    return
                action = self.sched.request(unit, state.now())
                if action is None:  # a fallback already gave its shard a cache
                    slots.release()
                    continue
                timeline.requested(action.record)
                if isinstance(action, UseHeld):
                    slots.release()
                    sent.put(Sent(action, None))
                    continue
                pending = self.link.send(self.file_id, action.ranges)
                if action.held is None:  # (a unit with a prefetched floor never waits on the link)
                    state.flights.setdefault(unit.needed_by, []).append(
                        (pending, action.least_bytes, sum(n for _, n in action.ranges)))
                sent.put(Sent(action, pending))
        except BaseException as e:  # noqa: BLE001 - handed to the executor, which raises it
            state.fail(StreamError(f"receiving the cache failed: {e}"))
        finally:
            sent.put(None)

    def _collect(self, state: StreamState, timeline: Timeline, sent: queue.Queue, slots: threading.Semaphore,
                 out: queue.Queue) -> None:
        """Wait for each sent request's bytes, in order; tell the scheduler, feed the reconstructor."""
        try:
            while (item := sent.get()) is not None:
                a, j = item.action, item.action.unit.needed_by
                if state.error is not None:  # drain, so the requester never blocks
                    if item.pending is not None and state.drop[j].is_set():  # the edit went local
                        timeline.dropped(a.record, self.link.receive(item.pending, drop=state.drop[j]).nbytes,
                                         state.now())
                    continue
                if isinstance(a, UseHeld) or a.held is not None:
                    self._from_device(state, timeline, slots, out, item)
                    continue
                tr = self.link.receive(item.pending, state.cut[j], [k for _, k in a.prefixes], state.drop[j])
                if state.drop[j].is_set():  # a fallback replaced the unit
                    self.sched.transferred(tr.nbytes, tr.t_request, tr.t_last_byte, tr.t_first_byte)
                    slots.release()
                    timeline.dropped(a.record, tr.nbytes, state.now())
                    continue
                level, ranges, whole = a.level, a.ranges, len(tr.parts) == len(a.ranges)
                if not whole:  # execution reached the unit first: its best prefix
                    level, ranges = next(lv for lv, k in a.prefixes if k == len(tr.parts)), ranges[:len(tr.parts)]
                    timeline.cut(a.record, level.label, tr.nbytes, state.now(), level.rung)
                # a cut transfer's bytes past its prefix came through too: the link's rate counts them
                active = self.sched.transferred(tr.nbytes if whole else max(tr.nbytes, tr.wire_bytes), tr.t_request,
                                                tr.t_last_byte, tr.t_first_byte)
                slots.release()
                state.hold(tr.nbytes)
                _arrived(state, timeline, a.record, tr, active, ranges)
                out.put(Received(a.unit, level, ranges, tr.parts, a.record, whole))
        except BaseException as e:  # noqa: BLE001 - handed to the executor, which raises it
            state.fail(StreamError(f"receiving the cache failed: {e}"))
            while sent.get() is not None:  # let the requester finish
                pass
        finally:
            out.put(None)

    def _from_device(self, state: StreamState, timeline: Timeline, slots: threading.Semaphore, out: queue.Queue,
                     item: Sent) -> None:
        """A unit with prefetched bytes: nothing to receive, or an upgrade that is used only if it comes
        before execution needs the unit (else the prefetched level)."""
        a, held = item.action, item.action.held
        if item.pending is not None:
            tr = self.link.receive(item.pending, drop=state.cut[a.unit.needed_by])
            active = self.sched.transferred(tr.nbytes, tr.t_request, tr.t_last_byte, tr.t_first_byte)
            slots.release()
            if len(tr.parts) == len(a.ranges):
                state.hold(tr.nbytes)
                _arrived(state, timeline, a.record, tr, active, a.ranges)
                out.put(Received(a.unit, a.level, a.ranges, tr.parts, a.record, True))
                return
            timeline.dropped(a.record, tr.nbytes, state.now(), held.level.label)
        else:
            timeline.arrived(a.record, state.now(), 0.0, held.ranges)
        state.hold(held.nbytes)
        out.put(Received(a.unit, held.level, held.ranges, held.parts, a.record, True))

    # -- reconstructor -----------------------------------------------------------------------------
    def _refetch(self, ranges, reason: str) -> list[bytes]:
        """The bytes of ``ranges`` once more, over the same paced link; a source with replicas is told to
        use the next one (:meth:`sakura.net.failover.FailoverSource.avoid`)."""
        avoid = getattr(getattr(self.link, "inner", None), "avoid", None)
        if avoid is not None:
            avoid(self.file_id, reason)
        return self.link.receive(self.link.send(self.file_id, ranges)).parts

    def _rebuild(self, state: StreamState, timeline: Timeline, inbox: queue.Queue) -> None:
        while (got := inbox.get()) is not None:
            if state.error is not None:
                continue  # drain, so the receiver never blocks on a full queue
            j = got.unit.needed_by
            if state.drop[j].is_set():  # a fallback replaced the shard while its bytes waited here
                state.hold(-sum(len(p) for p in got.parts))
                continue
            try:
                t0 = time.perf_counter()
                try:
                    kv = got.decode(self.encoding)
                except ChunkChecksumError as e:  # damaged bytes: fetch them once more (another source if any)
                    got.parts = self._refetch(got.ranges, str(e))
                    t0 = time.perf_counter()
                    kv = got.decode(self.encoding)
                took = time.perf_counter() - t0
                self.sched.rebuild_timed(got.level.work, took)
                if self.encoding.redecodable:
                    state.kept.setdefault(j, []).append(got)
            except Exception as e:  # noqa: BLE001 - malformed bytes: the executor raises it
                state.fail(StreamError(f"rebuilding fetch unit {got.unit.index} failed: {e}"))
                continue
            state.hold(sum(k.nbytes + v.nbytes for k, v in kv.values()) - sum(len(p) for p in got.parts))
            state.kv.update(kv)
            timeline.rebuilt(got.record, state.now())
            if self.sched.rebuilt(j, got.level, took):
                state.ready[j].set()


def _arrived(state: StreamState, timeline: Timeline, rec, tr, active_s: float, ranges) -> None:
    """``tr`` came through: the timeline gets its first and last bytes' times on the edit's clock, not when the
    collector woke to it (the replay of a real run's link reads rates off them)."""
    now, mono = state.now(), time.monotonic()
    timeline.arrived(rec, now - max(0.0, mono - tr.t_last_byte), active_s, ranges,
                     now - max(0.0, mono - tr.t_first_byte))
