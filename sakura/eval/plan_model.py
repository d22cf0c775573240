"""The clairvoyant planner's model of one streamed edit (issue #32): its problem, its options and what
a schedule of them costs. The solver is :mod:`sakura.eval.optimal`; the same transitions score a
schedule (:func:`evaluate`) and the brute force of the tests.

The model (the simulated clock's, :mod:`sakura.runtime.sim`, with every decision known in advance):

* Shards ``j = 0 … n−1`` execute in order; shard ``j`` takes ``shard_s[j]`` (calibrated compute) and
  starts at ``max(end of shard j−1, its cache ready)``; shard 0 may start after ``prelude_s``.
* Each shard's fetch units are requested in consumption order over one FIFO link (``LinkModel``: the
  scaled trace from the edit's start, request round trip ``request_overhead_s``, at most ``inflight``
  requests outstanding). A unit of shard ``j`` is requested at ``max(start of shard j−ahead, the
  ``inflight``-th previous request's last byte, the previous request)`` (the runtime's memory bound);
  its bytes start at ``max(request + round trip, the link free)`` and take the trace's integral.
  Rebuilds run one at a time in request order: ready = ``max(last byte, rebuilder free) + rebuild_s``.
* Per shard one *action*:
  - ``stream``: each of its units at one stored level (:class:`UnitOption`: bytes, estimated error,
    calibrated rebuild seconds; an anytime prefix is one of the unit's stored levels, so choosing it
    up front is never worse than cutting a larger one). A level's side data (CacheGen's entropy tables)
    is paid with the first use of that level in the edit.
  - ``reuse`` (step > 0, redecodable formats): the K/V of the same layers one step earlier, rebuilt
    again from the kept bytes — ready at ``max(end of shard j−1 + that shard's rebuild, rebuilder
    free)``; error = the step's change (``step_error``) + the kept level's error. Only from a shard that
    streamed or reused (a recomputed one keeps no bytes).
  - ``recompute`` (a step-0 shard): one full forward from the moment execution reaches it, exact K/V
    for it and every later step-0 shard (error 0, no transfer), ready ``full_step_s`` later.
  - ``local``: this step and every later one on every token from the moment execution reaches the
    shard; the edit ends ``(num_steps − step) · full_step_s`` later; every remaining unit counts
    ``local_error``.
  The runtime's fallbacks fire at its first check, ``CHECK_EVERY_S`` after execution reaches the shard,
  and only after its units were requested (their bytes are then wasted): the planner's are at the
  moment itself with nothing requested, so the optimum is a floor for the runtime.
* Quality: the sum over fetch units of their estimated error (the stored per-level error; a shard's
  units share a fallback's error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sakura.runtime.sim import LinkModel

STREAM, REUSE, RECOMPUTE, LOCAL = "stream", "reuse", "recompute", "local"


@dataclass(frozen=True)
class UnitOption:
    """One stored level of a fetch unit as the planner prices it."""

    label: str
    nbytes: int
    error: float
    rebuild_s: float
    side: str = ""  # side data this level needs once per edit (CacheGen's tables of its level)
    side_bytes: int = 0


@dataclass(frozen=True)
class PlanUnit:
    index: int
    shard: int
    options: tuple[UnitOption, ...]


@dataclass(frozen=True)
class PlanProblem:
    """One edit as the planner sees it: what the device computes, what it can fetch, the future link."""

    units: tuple[PlanUnit, ...]  # consumption order
    shard_s: tuple[float, ...]
    shard_step: tuple[int, ...]
    prelude_s: float
    num_steps: int
    full_step_s: float  # one denoising step on every token (local generation's time / steps)
    link: LinkModel
    ahead: int = 2
    step_error: tuple[float | None, ...] = ()  # per shard: the reuse fallback's added error (None: no reuse)
    allow_reuse: bool = True
    allow_recompute: bool = True
    allow_local: bool = True
    local_error: float = 1.0  # per unit, what going local counts (see ``local_error`` in the bench)

    @property
    def n(self) -> int:
        return len(self.shard_s)

    @property
    def per_step(self) -> int:
        return sum(1 for s in self.shard_step if s == self.shard_step[0])

    def shard_units(self, j: int) -> list[PlanUnit]:
        return [u for u in self.units if u.shard == j]


@dataclass(frozen=True)
class ShardAction:
    """What the schedule does for one shard; ``levels``: per unit of the shard (``stream`` only)."""

    kind: str
    levels: tuple[str, ...] = ()


@dataclass
class Schedule:
    """A whole edit's actions (one per shard up to a ``local``; a ``recompute`` covers the rest of step 0
    and is listed once per shard it covers), with what the model says it costs."""

    actions: list[ShardAction]
    latency_s: float
    total_error: float
    unit_error: dict[int, float] = field(default_factory=dict)  # per fetch unit index

    def to_dict(self) -> dict:
        return {"latency_s": self.latency_s, "total_error": self.total_error,
                "actions": [a.kind if a.kind != STREAM else "/".join(a.levels) for a in self.actions]}


# -- the state machine (shared by the DP, the brute force and schedule evaluation) -----------------------

@dataclass(frozen=True)
class PlanState:
    j: int  # next shard
    end: float  # end of shard j−1 (prelude for j = 0)
    starts: tuple[float, ...]  # starts of the last ``ahead`` shards (the gate reads them)
    link_free: float
    last_request: float
    arrivals: tuple[float, ...]  # last bytes of the last ``inflight`` requests
    rebuild_free: float
    kept: tuple[tuple[float, float] | None, ...]  # last ``per_step`` shards: (error, rebuild_s) a reuse reads
    sides: frozenset
    error: float
    latency: float | None = None  # set once the edit is over (after the last shard, or local)

    def vector(self, with_error: bool, side_names: tuple[str, ...]) -> tuple:
        """Every coordinate lower-is-better (dominance = all ≤)."""
        kept = []
        for k in self.kept:
            kept += [math.inf, math.inf] if k is None else [k[0], k[1]]
        sides = [0.0 if s in self.sides else 1.0 for s in side_names]
        done = [self.latency if self.latency is not None else -math.inf]
        return (self.end, *self.starts, self.link_free, self.last_request, *self.arrivals, self.rebuild_free,
                *kept, *sides, *done, *([self.error] if with_error else []))


def initial_state(p: PlanProblem) -> PlanState:
    # (no request yet reads as a last byte at −inf: the slot is open, as the runtime's 0 s)
    return PlanState(0, p.prelude_s, (), 0.0, 0.0, (-math.inf,) * p.link.inflight, 0.0, (None,) * p.per_step,
                  frozenset(), 0.0)


def _start_shard(p: PlanProblem, s: PlanState, ready: float, kept, error: float, **changes) -> PlanState:
    j = s.j
    start = max(s.end, ready)
    end = start + p.shard_s[j]
    starts = (s.starts + (start,))[-p.ahead:] if p.ahead > 0 else ()
    kept_window = (s.kept + (kept,))[1:]
    nxt = PlanState(j + 1, end, starts, changes.get("link_free", s.link_free),
                 changes.get("last_request", s.last_request), changes.get("arrivals", s.arrivals),
                 changes.get("rebuild_free", s.rebuild_free), kept_window, changes.get("sides", s.sides),
                 s.error + error)
    if j + 1 == p.n:
        return PlanState(**{**nxt.__dict__, "latency": end})
    return nxt


def _gate_open(p: PlanProblem, s: PlanState, shard: int) -> float:
    """When shard ``shard``'s units may be requested: the start of shard ``shard − ahead``."""
    g = shard - p.ahead
    if g < 0:
        return 0.0
    back = s.j - g  # starts holds the last ``ahead`` shards' starts, the newest last
    return s.starts[-back]


def step_stream(p: PlanProblem, s: PlanState, choice: tuple[UnitOption, ...]) -> PlanState:
    """Stream shard ``s.j``'s units at ``choice`` (one option per unit, in order)."""
    link = p.link
    link_free, last_request, arrivals, rebuild_free = s.link_free, s.last_request, s.arrivals, s.rebuild_free
    sides, ready, error, rebuild_total = s.sides, 0.0, 0.0, 0.0
    opens = _gate_open(p, s, s.j)
    for opt in choice:
        slot = arrivals[-link.inflight]
        t_req = last_request = max(opens, slot, last_request)
        nbytes = opt.nbytes + (opt.side_bytes if opt.side and opt.side not in sides else 0)
        if opt.side:
            sides = sides | {opt.side}
        t_arr = link_free = link.arrival(nbytes, t_req, link_free)
        arrivals = (arrivals + (t_arr,))[-link.inflight:]
        rebuild_free = max(t_arr, rebuild_free) + opt.rebuild_s
        ready = max(ready, rebuild_free)
        error += opt.error
        rebuild_total += opt.rebuild_s
    mean_error = error / len(choice) if choice else 0.0
    return _start_shard(p, s, ready, (mean_error, rebuild_total), error, link_free=link_free,
                        last_request=last_request, arrivals=arrivals, rebuild_free=rebuild_free, sides=sides)


def reuse_error(p: PlanProblem, s: PlanState) -> float | None:
    """The error each unit of shard ``s.j`` gets from a reuse (None: no reuse possible)."""
    j = s.j
    step_err = p.step_error[j] if j < len(p.step_error) else None
    if not p.allow_reuse or p.shard_step[j] == p.shard_step[0] or step_err is None or s.kept[0] is None:
        return None
    return step_err + s.kept[0][0]


def step_reuse(p: PlanProblem, s: PlanState) -> PlanState:
    kept_error, kept_rebuild = s.kept[0]
    err = reuse_error(p, s)
    ready = max(s.end + kept_rebuild, s.rebuild_free)
    return _start_shard(p, s, ready, (err, kept_rebuild), err * len(p.shard_units(s.j)), rebuild_free=ready)


def recompute_shards(p: PlanProblem, j: int) -> list[int]:
    """The shards a recompute at shard ``j`` covers (it and the rest of step 0)."""
    first = p.shard_step[0]
    return [k for k in range(j, p.n) if p.shard_step[k] == first] if p.shard_step[j] == first else []


def step_recompute(p: PlanProblem, s: PlanState) -> PlanState:
    ready = s.end + p.full_step_s
    for _ in recompute_shards(p, s.j):
        s = _start_shard(p, s, ready, None, 0.0)
    return s


def local_latency(p: PlanProblem, s: PlanState) -> float:
    return s.end + (p.num_steps - p.shard_step[s.j]) * p.full_step_s


def step_local(p: PlanProblem, s: PlanState) -> PlanState:
    rest = sum(1 for u in p.units if u.shard >= s.j)
    return PlanState(**{**s.__dict__, "j": p.n, "error": s.error + p.local_error * rest,
                     "latency": local_latency(p, s)})


def apply(p: PlanProblem, s: PlanState, action: ShardAction) -> PlanState:
    if action.kind == STREAM:
        by_label = [{o.label: o for o in u.options} for u in p.shard_units(s.j)]
        return step_stream(p, s, tuple(opts[label] for opts, label in zip(by_label, action.levels)))
    if action.kind == REUSE:
        return step_reuse(p, s)
    if action.kind == RECOMPUTE:
        return step_recompute(p, s)
    if action.kind == LOCAL:
        return step_local(p, s)
    raise ValueError(f"unknown action {action.kind!r}")


def evaluate(p: PlanProblem, actions: list[ShardAction]) -> Schedule:
    """What the model says a schedule costs (``recompute`` is given once, at the shard it starts)."""
    s, listed, unit_error = initial_state(p), [], {}
    for action in actions:
        if s.latency is not None:
            break
        j0 = s.j
        s2 = apply(p, s, action)
        covered = range(j0, s2.j) if action.kind != LOCAL else range(j0, p.n)
        for k in covered:
            listed.append(action)
            for u in p.shard_units(k):
                if action.kind == STREAM:
                    unit_error[u.index] = next(o.error for o in u.options if o.label == action.levels[
                        p.shard_units(k).index(u)])
                elif action.kind == REUSE:
                    unit_error[u.index] = reuse_error(p, s)
                elif action.kind == RECOMPUTE:
                    unit_error[u.index] = 0.0
                else:
                    unit_error[u.index] = p.local_error
        s = s2
    if s.latency is None:
        raise ValueError("the schedule does not cover every shard")
    return Schedule(listed, s.latency, s.error, unit_error)


# -- the options of one shard ---------------------------------------------------------------------------
