"""Every decision of one streamed edit, for both clocks: which unit to ask for next and at which level,
whether prefetched bytes already serve it, when a shard may execute, and what to do while execution
waits on one (wait, reuse, recompute, go local).

Pure: no clock, no threads of its own, no I/O. A driver tells it what happened and when — a request slot
opened (:meth:`StreamScheduler.request`), a transfer's bytes are through (:meth:`transferred`), a unit
was rebuilt (:meth:`rebuilt`), a shard started executing (:meth:`shard_started`), execution is waiting
on a shard (:meth:`waiting`) — and carries out the typed action it answers. The real-clock driver
(:mod:`sakura.runtime.stream`: threads over a paced link) and the simulated one
(:mod:`sakura.runtime.sim`: a replay over a bandwidth trace) differ only in how they learn the times.
Cuts (anytime shards) are decided by :func:`sakura.net.paced.cut_point`, on both clocks.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

from sakura.formats import FetchUnit, Level, Range, StreamEncoding
from sakura.online.deadline import predict_need
from sakura.online.fallback import (
    FallbackContext,
    InFlight,
    choose_fallback,
    mean_or_none,
    observed_rate_bps,
    predict_ready,
)
from sakura.online.monitor import RuntimeMonitor
from sakura.online.plan import Horizon
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.prefetch import HeldUnit
from sakura.runtime.timeline import UnitRecord


@dataclass(frozen=True)
class Fetch:
    """Ask the link for ``ranges``: ``level`` of ``unit``. ``held``: prefetched bytes of the unit, a floor
    used instead when the upgrade is not all through by the time execution needs it."""

    unit: FetchUnit
    level: Level
    ranges: list[Range]
    prefixes: list[tuple[Level, int]]  # usable leading ranges, smallest first; the last is all of them
    record: UnitRecord
    held: HeldUnit | None = None

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.ranges)

    @property
    def least_bytes(self) -> int:
        """Bytes of the smallest usable prefix: what execution must wait for at least."""
        return sum(n for _, n in self.ranges[:self.prefixes[0][1]])


@dataclass(frozen=True)
class UseHeld:
    """No request: the prefetched bytes are as good as anything the policy would fetch now."""

    unit: FetchUnit
    held: HeldUnit
    record: UnitRecord


@dataclass(frozen=True)
class FallbackChoice:
    """What execution does about ``shard``, which it is waiting on: ``wait``, ``reuse`` (the K/V of its
    layers one step earlier, shard ``reuse_from``), ``recompute`` (step 0's K/V on the device: every shard
    in ``shards``) or ``local`` (every token from ``local_from_step`` on; no shard needs a cache any more)."""

    kind: str
    shard: int
    ends: dict[str, float] = field(default_factory=dict)  # each option's expected end of the edit
    shards: tuple[int, ...] = ()  # the shards this choice gives a cache (their transfers stop)
    reuse_from: int | None = None
    local_from_step: int | None = None


WAIT = "wait"
# (anytime) Execution reaching a shard whose bytes are still coming may wait this share of the shard's compute for
# them when they are predicted through by then, rather than cutting at once (the clairvoyant optimum lets execution
# wait a few ms for a level's last bytes). Off: on the traces' first halves every share tried (0.1, 0.25, 0.25 within
# one shard's compute per edit) bought ≤ 0.4 dB capped for 0.4–4 % latency at p50 (issue #32, policy6).
CUT_WAIT_SHARE = 0.0
# A cut that waits from the edit's stall budget waits this many times the rest's predicted time (a rate a little
# slower than predicted still brings the last bytes).
CUT_WAIT_MARGIN = 1.5


class StreamScheduler:
    """The decisions of one streamed edit. Safe to call from several threads (the real clock's requester,
    collector, rebuilder and executor): each call holds the scheduler's lock."""

    def __init__(self, encoding: StreamEncoding, policy: Policy, predicted: ComputeProfile, monitor: RuntimeMonitor,
                 ahead: int = 2, anytime: bool = True, fallback: FallbackContext | None = None,
                 held: dict[int, HeldUnit] | None = None, cut_wait_share: float = CUT_WAIT_SHARE):
        self.encoding, self.policy, self.predicted, self.monitor = encoding, policy, predicted, monitor
        self.cut_wait_share = cut_wait_share
        self.ahead, self.anytime, self.fallback, self.held = ahead, anytime, fallback, held or {}
        n = len(predicted.shards)
        self.per_step = sum(1 for s, _, _ in predicted.shards if s == predicted.shards[0][0])
        self.starts: list[float | None] = [None] * n  # per shard: when execution started it
        self.pending = [sum(1 for u in encoding.units if u.needed_by == j) for j in range(n)]  # units not rebuilt
        self.rebuild_s: dict[int, float] = {}  # per shard with data: its rebuild time (what a reuse of it costs)
        self.kv_error: dict[int, list[float]] = {}  # per shard: its units' level errors (what a reuse keeps)
        self.wait_error: dict[int, list[float]] = {}  # per shard: its asked-for units' smallest usable prefix errors
        self.replaced: set[int] = set()  # shards a fallback gave a cache: their units are not asked for
        self.asked: set[int] = set()  # fetch units answered with a request or the held bytes
        self.asked_error = 0.0  # their weighted error at the levels asked for (or held)
        # how much later than on time the edit may still be for better levels (planned late, a cut that waits)
        self.stall_left_s = policy.stall_share * predicted.masked_s
        self.planned_late: dict[int, float] = {}  # per shard: how late its units were planned, from that budget
        self.local_from_step: int | None = None
        # (anytime) execution cuts shard 0 no earlier than this: the deadline its units were chosen for
        self.startup_until = 0.0
        # (anytime) when shard 0's asked-for bytes are predicted through at R̂ (queued on the link in order), and
        # rebuilt: execution starts then if that is before the hold's end (a level chosen with the margin γ, or
        # for less than the hold)
        self.startup_arrival = self.startup_ready = 0.0
        self.asked_log: list[tuple[int, float, int]] = []  # every request: (its shard, when, the bytes asked for)
        self._lock = threading.RLock()

    def begin(self) -> None:
        """Before the first request: policies that plan the whole edit (IntQ) do it here."""
        self.policy.begin(self.encoding.units, self.predicted.masked_s, self.monitor.initial_bps)

    def choice_deadline(self, unit: FetchUnit, deadline: float, now: float) -> float:
        """The deadline the policy chooses ``unit``'s level for. A policy keeps a margin (γ) for bytes that
        come late and stall execution; shard 0's of a progressive encoding cannot stall it past the start-up
        hold (execution cuts them there to the prefix that came), so they are chosen for the whole hold, as
        the clairvoyant optimum spends it (issue #32): the margin would leave a fifth of it to wait out."""
        if not (unit.needed_by == 0 and self.cuts):
            return deadline
        return now + (deadline - now) / getattr(self.policy, "gamma", 1.0)

    @property
    def startup_lead_s(self) -> float:
        """Shard 0's units are chosen for the lead every later unit gets from its gate (the compute of the
        ``ahead`` shards before it), not for the prelude, and execution waits that long for them (a video
        player's start-up buffer): before execution starts nothing overlaps a transfer, and a shard 0 chosen
        for the prelude alone is the edit's poorest level, which the clairvoyant optimum never picks
        (issue #32 item 3)."""
        return self.policy.hold_scale * sum(self.predicted.shard_s[:self.ahead])

    @property
    def startup_at(self) -> float:
        """(anytime) When shard 0 is predicted to start as the device sees it (0: not yet known): its asked-for
        bytes through at R̂ and rebuilt, at the hold's end at the latest (execution cuts them there)."""
        return min(self.startup_until, self.startup_ready) if self.anytime else 0.0

    def _startup_asked(self, level: Level, nbytes: int, now: float) -> None:
        """Shard 0's unit asked for ``nbytes`` at ``level``: its bytes queue behind shard 0's others on the link."""
        self.startup_arrival = max(self.startup_arrival, now) + nbytes * 8 / max(self.monitor.rate_bps, 1.0)
        self.startup_ready = max(self.startup_ready, self.startup_arrival + self.monitor.rebuild.seconds(level.work))

    @property
    def cuts(self) -> bool:
        """Execution takes a unit as far as it came when it needs it (anytime shards of a progressive pack);
        otherwise it waits for all of it."""
        return self.anytime and self.encoding.progressive

    # -- requests ---------------------------------------------------------------------------------
    def gate(self, unit: FetchUnit) -> int | None:
        """The shard whose start lets ``unit`` be asked for (None: at once): at most ``ahead`` shards wait
        beside the one executing, so cache memory stays bounded whatever the template size."""
        shard = unit.needed_by - self.ahead
        return shard if shard >= 0 else None

    def request(self, unit: FetchUnit, now: float) -> Fetch | UseHeld | None:
        """A request slot is free for ``unit`` (in consumption order) at ``now``: what to ask for, if
        anything (None: a fallback already gave its shard a cache)."""
        with self._lock:
            if unit.index in self.asked:
                raise ValueError(f"fetch unit {unit.index} was already requested")
            if unit.needed_by in self.replaced or self.local_from_step is not None:
                return None
            self.asked.add(unit.index)
            unit = self.encoding.priced(unit)
            # (a later shard's unit asked for before the start is needed after shard 0 starts, not after the
            # prelude: chosen for the prelude's end it takes the poorer level the optimum never picks, issue #32)
            deadline = self.need(unit.needed_by, now, self.startup_at)
            # (the simulated clock books a unit after it settled the shards before its own: a start in the
            # future of ``now`` had not happened when the device asked)
            before_start = self.starts[0] is None or self.starts[0] > now
            if self.anytime and unit.needed_by == 0:
                deadline = self.startup_until = max(deadline, now + self.startup_lead_s, self.startup_until)
            choose = self.policy.choose_before_start if before_start else self.policy.choose
            horizon = self.horizon(unit, now, deadline) if self.policy.plans_ahead else None
            d = choose(unit, now, self.choice_deadline(unit, deadline, now), self.monitor, horizon)
            if d.stall_s > 0:
                self.stall_left_s -= d.stall_s
                self.planned_late[unit.needed_by] = self.planned_late.get(unit.needed_by, 0.0) + d.stall_s
            held = self.held.get(unit.index)
            self.asked_error += unit.weight * min(d.level.error, held.level.error if held is not None else math.inf)
            if held is not None and d.level.error >= held.level.error:  # nothing better: no request
                return UseHeld(unit, held, UnitRecord(unit.index, unit.needed_by, unit.label, held.level.label, 0,
                                                      d.budget_bytes, d.window_s, d.rate_bps / 1e6, True, now,
                                                      deadline_t=deadline, prefetched=True, rung=held.level.rung))
            ranges = self.encoding.ranges(unit, d.level)
            self.asked_log.append((unit.needed_by, now, sum(n for _, n in ranges)))
            if self.anytime and unit.needed_by == 0:
                self._startup_asked(d.level, sum(n for _, n in ranges), now)
            prefixes = self.encoding.prefixes(unit, d.level, ranges) if self.anytime else [(d.level, len(ranges))]
            self.wait_error.setdefault(unit.needed_by, []).append(prefixes[0][0].error)
            rec = UnitRecord(unit.index, unit.needed_by, unit.label, d.level.label, sum(n for _, n in ranges),
                             d.budget_bytes, d.window_s, d.rate_bps / 1e6, d.fits, now, deadline_t=deadline,
                             ranges=len(ranges), rung=d.level.rung, planned_late_s=d.stall_s)
            return Fetch(unit, d.level, ranges, prefixes, rec, held)

    def horizon(self, unit: FetchUnit, now: float, deadline: float) -> Horizon:
        """``unit`` (due at ``deadline``) and every unit after it, as the device predicts the rest of the edit at
        ``now``: when execution reaches each one's shard (no stalls) and when each may be asked for."""
        # (before shard 0's bytes are asked for, the start is the hold's end)
        hold = self.startup_at if self.startup_ready else self.startup_until
        rest = [self.encoding.priced(u) for u in self.encoding.units
                if u.index > unit.index and u.index not in self.asked and u.needed_by not in self.replaced]
        need = {j: self.need(j, now, hold) for j in {u.needed_by for u in rest}}
        need[unit.needed_by] = deadline

        def gate_s(u: FetchUnit) -> float:
            g = self.gate(u)
            if g is None:
                return now
            started = self.starts[g]
            return started if started is not None and started <= now else max(now, self.need(g, now, hold))

        # when the bytes asked for so far are through: every request replayed on the FIFO link at today's estimates
        # (a rate learnt since corrects the queue a poor first estimate predicted); a fallback's shards left the link,
        # and a shard's transfers end when execution reaches it (cut there, or through before)
        link_free, bps, trip = 0.0, max(self.monitor.link_rate_bps, 1.0), self.monitor.round_trip_s
        for j, t, n in self.asked_log:
            if j in self.replaced:
                continue
            end, started = max(link_free, t + trip) + n * 8 / bps, self.starts[j]
            link_free = max(link_free, min(end, started) if started is not None and started <= now else end)
        units = (unit, *rest)
        # (shard 0's units are chosen for the start-up hold, which execution cuts them at: none is planned late)
        return Horizon(now, units, tuple(need[u.needed_by] for u in units), tuple(gate_s(u) for u in units),
                       max(now, link_free), trip, self.asked_error, self.stall_left_s if unit.needed_by else 0.0)

    def need(self, shard: int, now: float, hold_until: float) -> float:
        """When execution is predicted to reach ``shard`` (:func:`predict_need`), later by the stalls planned for
        the units of it and of the shards before it that have not started."""
        late = sum(s for j, s in self.planned_late.items()
                   if j <= shard and (self.starts[j] is None or self.starts[j] > now))
        return predict_need(shard, now, self.predicted, self.starts, hold_until=hold_until) + late

    # -- what the device learns --------------------------------------------------------------------
    def transferred(self, nbytes: int, t_request: float, t_last_byte: float,
                    t_first_byte: float | None = None) -> float:
        """A transfer's bytes are through (whole, cut or dropped): the monitor's rate learns from it.
        Returns the seconds it was active on the link."""
        with self._lock:
            return self.monitor.observe(nbytes, t_request, t_last_byte, t_first_byte)

    def rebuild_timed(self, work: float, seconds: float) -> None:
        """A rebuild of ``work`` (its level's ``work``) took ``seconds``: the monitor's rebuild rate learns from
        it. (Apart from :meth:`rebuilt` because the simulated clock settles rebuilds ahead of time and tells
        the monitor only once the device would know.)"""
        with self._lock:
            self.monitor.rebuild.observe(work, seconds)

    def rebuilt(self, shard: int, level: Level, seconds: float) -> bool:
        """One of ``shard``'s units is rebuilt at ``level`` in ``seconds``; True when the shard has all of
        its units (it may execute)."""
        with self._lock:
            self.rebuild_s[shard] = self.rebuild_s.get(shard, 0.0) + seconds
            self.kv_error.setdefault(shard, []).append(level.error)
            self.pending[shard] -= 1
            return self.ready(shard)

    def ready(self, shard: int) -> bool:
        """Execution may start ``shard``: all its units are rebuilt, or a fallback gave it a cache."""
        return self.pending[shard] <= 0 or shard in self.replaced

    def shard_started(self, shard: int, t: float) -> None:
        with self._lock:
            if not self.ready(shard):
                raise ValueError(f"shard {shard} started before its cache was provided")
            self.starts[shard] = t

    # -- while execution waits -------------------------------------------------------------------
    def cut_at(self, shard: int, now: float, remaining_bytes: float) -> float:
        """(anytime) Execution reached ``shard`` at ``now`` (or shard 0's hold ended) with ``remaining_bytes`` of
        its transfers not through: when to cut them to the prefixes that came. At once, or, when the rest is
        predicted through at the link's rate within ``cut_wait_share`` of the shard's compute, or within the stall
        planned for its units and what is left of the edit's stall budget, at the end of that wait (a late
        prediction costs no more than it; a cut to the prefix below an exact rung loses tens of dB, issue #32)."""
        with self._lock:
            if not self.cuts or remaining_bytes <= 0:
                return now
            through_s = remaining_bytes * 8 / max(self.monitor.link_rate_bps, 1.0)
            share = self.cut_wait_share * self.predicted.shard_s[shard]
            if through_s <= share:
                return now + share
            planned = self.planned_late.get(shard, 0.0)
            wait = min(planned + self.stall_left_s, max(planned, CUT_WAIT_MARGIN * through_s))
            if through_s <= wait:
                self.stall_left_s -= max(0.0, wait - planned)
                return now + wait
            return now

    def reuse_s(self, shard: int) -> float | None:
        """What running ``shard`` on its layers' K/V of one step earlier costs (their kept bytes' rebuild);
        None: the device keeps none (step 0, a format whose bytes do not decode twice, no data)."""
        prev = shard - self.per_step
        if prev < 0 or not self.encoding.redecodable:
            return None
        return self.rebuild_s.get(prev)

    def waiting(self, shard: int, now: float, flights: list[InFlight]) -> FallbackChoice:
        """Execution has waited on ``shard`` up to ``now``; ``flights``: its transfers still on the link,
        as the device sees them. Re-decided every ``CHECK_EVERY_S`` (:mod:`sakura.online.fallback`)."""
        with self._lock:
            fb = self.fallback
            if fb is None or not any(f.delivered < f.need_bytes for f in flights):
                return FallbackChoice(WAIT, shard)  # the paper's runtime; or only a rebuild is left
            prev = shard - self.per_step
            times = list(self.rebuild_s.values())
            ready = predict_ready(now, flights, self.monitor.rate_bps, sum(times) / max(1, len(times)))
            reuse_s = self.reuse_s(shard)
            kept_error = mean_or_none(self.kv_error.get(prev))
            wait_error = mean_or_none(self.wait_error.get(shard))
            kind, ends = choose_fallback(fb, shard, now, ready, reuse_s,
                                         observed_rate_bps(self.monitor.rate_bps, flights), kept_error, wait_error)
            if kind == WAIT:
                return FallbackChoice(WAIT, shard, ends)
            n = len(self.starts)
            if kind == "local":
                self.local_from_step = fb.shard_step[shard]
                mine = tuple(range(shard, n))
                choice = FallbackChoice(kind, shard, ends, mine, local_from_step=self.local_from_step)
            elif kind == "recompute":  # step 0's K/V are request-independent: exact, for the rest of step 0
                mine = tuple(j for j in range(shard, n) if fb.shard_step[j] == 0)
                for j in mine:
                    self.kv_error[j] = [0.0]
                choice = FallbackChoice(kind, shard, ends, mine)
            else:
                self.rebuild_s[shard] = self.rebuild_s[prev]
                reused = fb.reuse_error(shard, kept_error)
                self.kv_error[shard] = [] if reused is None else [reused]
                choice = FallbackChoice(kind, shard, ends, (shard,), reuse_from=prev)
            self.replaced.update(choice.shards)
            return choice
