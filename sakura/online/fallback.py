"""Fallbacks: what the device does when a shard's cache will not arrive before execution needs it.

Four ways past such a shard, chosen by predicted completion time (both clocks call
:func:`choose_fallback` the same way, every ``CHECK_EVERY_S`` while execution waits):

* ``wait`` for the smallest usable prefix (anytime shards) — no quality cost, costs the stall;
* ``reuse`` the previous denoising step's K/V of the same layers, rebuilt from the compressed bytes the
  device kept — costs one rebuild, no transfer; adjacent steps' K/V differ by ~26 % (relative L2) on
  the embedded catalog, and one reused shard leaves the masked output at 49–68 dB against the
  FP16-cache output (``python -m sakura.eval.fallback_quality``);
* ``recompute`` (step 0 only): the device computes the template's step-0 K/V itself — at step 0
  every token is the template's fixed noise, so the state is request-independent and one full forward
  gives exactly the stored FP16 cache; the rest of step 0 needs no transfer. Later steps' state
  depends on the template run's trajectory, which the device does not have;
* ``local``: the current step and every later one run on every token (the model needs no cache) —
  costs the full model for the remaining steps, and the output becomes local generation's from there.

How the choice is made. Each option has an *expected* end: the transfer in progress at the rate it shows
now, and the later shards' smallest levels at that same rate (a link that crawls now makes every option
that still streams slow, not only this shard). Every option but ``local`` keeps streaming, so it can
still go wrong: the link may die. Its *worst case* is the end if nothing more arrives from now on and the
device escapes at the next point it could stall — by reusing for every remaining shard where the previous
step's bytes are kept (a reused shard's K/V is kept for the next step in turn), else by going local:
waiting escapes one check from now; ``recompute`` at step 1 (step 0 kept no compressed bytes, so
locally, after one full step and the rest of step 0's masked shards); ``reuse`` at the next shard. A
streaming option stays open while its worst case ends within ``hard_s`` (``HARD_SHARE`` × local
generation) or its expected end is within ``bound_s`` (a share of local generation's time); the device
goes local only when none is. ``recompute``'s worst case may pass ``hard_s`` by the rest of step 0's
masked shards: they run on exact K/V rather than wait, and step 0 exact then local from step 1 is closer
to the FP16-cache output than local from step 0 (what the clairvoyant optimum picks on a dead link,
issue #32). So an edit whose link dies ends within ``HARD_SHARE`` of local generation, plus step 0's
masked shards where it recomputed (up to compute-time prediction error), an edit whose link still
moves is not thrown to local for a short stall, and a link that comes back within the slack is still
used (going local is final, and dead links in the traces often come back within a second). Among the
open options, those without a quality cost (``recompute``: exact K/V; ``wait``) win when they are
expected to end within ``bound_s``; past it, the earliest expected end wins (the better worst case on a
tie: a dead link expects nothing).
A wait is only as good as the prefix it waits for: where the pack says how good that is and how far
the previous step's K/V are from this step's (``step_error``, recorded at build in the levels' metric),
a wait for a prefix not ``WAIT_GAIN`` × better than the reuse has no claim to be quality-free and is
taken only by its expected end — a long stall for a smallest prefix no better than the previous step's
K/V buys nothing (it made one fs edit on the 5G trace 1.1 s slower than the reuse next to it).
The wait is predicted from what the device sees: the bytes of the transfer delivered so far and the
monitor's rate, capped by the rate this transfer itself has shown over its last ``OBSERVE_WINDOW_S``
once it has run for ``MIN_OBSERVED_S`` (a link that has gone silent reads as silent, not as its past
average; one that came back reads as back) — or, before its first byte, for ``FIRST_BYTE_S``: on a real link a
request's first byte waits for the server and for what is queued ahead of it (on the kernel-shaped link, a
new connection after a cut, behind the cut transfer's queued bytes), which is no evidence of a dead link.
"""

from __future__ import annotations

from dataclasses import dataclass

FALLBACKS = ("reuse", "recompute", "local")  # what can fire (``wait`` is the absence of a fallback)
CHECK_EVERY_S = 0.01  # a waiting executor re-decides this often
MIN_OBSERVED_S = 0.02  # a transfer's own rate counts once it has been on the link this long
FIRST_BYTE_S = 0.1  # ... or, while none of its bytes has come, this long
OBSERVE_WINDOW_S = 0.1  # ... measured over its last this-many seconds
BOUND_SHARE = 0.9  # wait while the edit is predicted to end within this share of local generation's time
HARD_SHARE = 1.1  # no option whose worst case ends later than this share of local generation's time
MIN_RATE_BPS = 1.0  # a rate is never zero in a division
WAIT_GAIN = 2.0  # a wait is free when its prefix's error is at most half a reuse's (3 dB in the pack's metric)


@dataclass(frozen=True)
class InFlight:
    """One transfer a waiting shard still needs, as the device sees it at ``now``."""

    need_bytes: int  # bytes of its smallest usable prefix (or of all of it, without anytime)
    delivered: float  # bytes through so far
    active_s: float  # how long its bytes have been on the link (0: not started)
    recent_bytes: float = 0.0  # bytes through in the last ``recent_s`` (what the link does now)
    recent_s: float = 0.0


def in_flight(trace, begin: float, now: float, need_bytes: int, total_bytes: float) -> InFlight:
    """What a device sees of a transfer whose bytes started at trace time ``begin``: bytes through so
    far and in the last ``OBSERVE_WINDOW_S`` (both clocks read the emulated link the same way)."""
    if now <= begin:
        return InFlight(need_bytes, 0.0, 0.0)
    got = min(total_bytes, trace.bytes_between(begin, now))
    since = max(begin, now - OBSERVE_WINDOW_S)
    recent = min(got, trace.bytes_between(since, now))
    return InFlight(need_bytes, got, now - begin, recent, now - since)


def observed_rate_bps(monitor_bps: float, transfers: list[InFlight]) -> float:
    """The monitor's rate, capped by what the transfers in progress show now (their last
    ``OBSERVE_WINDOW_S``: a link that has gone silent reads as silent, one that came back as back)."""
    rate = max(monitor_bps, MIN_RATE_BPS)
    for tr in transfers:
        if tr.active_s >= (MIN_OBSERVED_S if tr.delivered > 0 else FIRST_BYTE_S) and tr.recent_s > 0:
            rate = min(rate, max(8 * tr.recent_bytes / tr.recent_s, MIN_RATE_BPS))
    return rate


def mean_or_none(errors) -> float | None:
    """The error of a shard from its units' errors (None: none known)."""
    return sum(errors) / len(errors) if errors else None


def predict_ready(now: float, transfers: list[InFlight], monitor_bps: float, rebuild_s: float) -> float:
    """When the waiting shard's cache is predicted to be rebuilt (transfers share the link in order)."""
    rate = observed_rate_bps(monitor_bps, transfers)
    remaining = sum(max(0.0, tr.need_bytes - tr.delivered) for tr in transfers)
    return now + 8 * remaining / rate + rebuild_s


@dataclass(frozen=True)
class FallbackContext:
    """What the choice needs to know about the edit (fixed for the edit)."""

    shard_s: list[float]  # predicted execution time of each shard
    shard_step: list[int]  # the denoising step of each shard
    num_steps: int
    full_step_s: float  # one step on every token (local generation's time / steps)
    bound_s: float  # quality-free options are taken while the edit ends by then
    hard_s: float  # no option whose worst case ends later (see the module's docstring)
    allow_local: bool = True  # the executor can run the model on every token (eager model runs)
    allow_recompute: bool = True  # ... and step 0's units can be dropped (the encoding keeps no edit state)
    least_bytes: tuple[float, ...] = ()  # per shard: bytes of its units' smallest levels still to fetch
    # Per shard, in the pack's tradeoff metric (None: not known): the error of its smallest levels (what a
    # wait gets) and of its layers' K/V one step earlier against its own (what a reuse adds).
    least_error: tuple[float | None, ...] = ()
    step_error: tuple[float | None, ...] = ()

    @classmethod
    def for_edit(cls, compute, num_steps: int, allow_local: bool = True, allow_recompute: bool = True,
                 least_bytes=(), bound_share: float = BOUND_SHARE, hard_share: float = HARD_SHARE,
                 least_error=(), step_error=()) -> "FallbackContext":
        return cls(list(compute.shard_s), [s for s, _, _ in compute.shards], num_steps,
                   compute.local_full_s / max(1, num_steps), bound_share * compute.local_full_s,
                   hard_share * compute.local_full_s, allow_local, allow_local and allow_recompute,
                   tuple(least_bytes), tuple(least_error), tuple(step_error))

    def reuse_error(self, shard: int, kept_error: float | None) -> float | None:
        """The error of running ``shard`` on its layers' K/V of one step earlier, rebuilt at
        ``kept_error``: the two add (the step's change and the compression are unrelated)."""
        step = self.step_error[shard] if shard < len(self.step_error) else None
        return None if step is None or kept_error is None else step + kept_error

    def wait_is_free(self, shard: int, kept_error: float | None, wait_error: float | None = None) -> bool:
        """A wait counts as quality-free when what it waits for is known to be ``WAIT_GAIN`` × better than
        a reuse, or nothing is known; otherwise it is one more option, taken by its expected end (a stall
        for a prefix no better than the previous step's K/V buys nothing). ``wait_error``: the error of the
        smallest usable prefix of what was asked for (a wait on a nearly complete top level is not a wait
        for the shard's smallest level); default: the shard's smallest level's."""
        least = wait_error if wait_error is not None else (
            self.least_error[shard] if shard < len(self.least_error) else None)
        reuse = self.reuse_error(shard, kept_error)
        return least is None or reuse is None or WAIT_GAIN * least <= reuse

    def later_bytes(self, shard: int, first_step: int = 0) -> float:
        """The smallest bytes shards after ``shard`` (from step ``first_step`` on) still need."""
        return sum(b for k, b in enumerate(self.least_bytes) if k > shard and self.shard_step[k] >= first_step)

    def local_end(self, t: float, step: int) -> float:
        """The edit's end if it goes local at ``t``: this step and every later one on every token."""
        return t + (self.num_steps - step) * self.full_step_s


def choose_fallback(ctx: FallbackContext, shard: int, now: float, ready_s: float, reuse_s: float | None,
                    rate_bps: float = float("inf"), kept_error: float | None = None,
                    wait_error: float | None = None) -> tuple[str, dict[str, float]]:
    """``wait``, ``reuse``, ``recompute`` or ``local`` for ``shard`` waited on at ``now``, and each
    option's expected end of the edit. ``ready_s``: predicted time its cache is rebuilt; ``reuse_s``:
    the rebuild time of the previous step's kept bytes for the same layers (None: the device holds none);
    ``rate_bps``: the rate the link shows now (what later shards' bytes are expected to take);
    ``kept_error``: the error those kept K/V were rebuilt at (None: not known); ``wait_error``: the error of
    what the wait gets (:meth:`FallbackContext.wait_is_free`)."""
    rest, step, n_rest = sum(ctx.shard_s[shard:]), ctx.shard_step[shard], len(ctx.shard_s) - shard
    last = ctx.shard_s[-1]

    def streamed(t: float, nbytes: float) -> float:  # later shards' bytes through from t, then the last shard
        return t + 8 * nbytes / max(rate_bps, MIN_RATE_BPS) + last if nbytes else 0.0

    def escape(t: float) -> float:  # the end if the link dies now and the device escapes at t
        return t + n_rest * reuse_s + rest if reuse_s is not None else ctx.local_end(t, step)

    later = ctx.later_bytes(shard)
    ends = {"wait": max(ready_s + rest, streamed(ready_s, later))}
    worst = {"wait": escape(now + CHECK_EVERY_S) if ready_s > now + CHECK_EVERY_S else now}
    slack: dict[str, float] = {}  # past the hard bound: work in an option's worst case that is not a stall
    if ctx.allow_recompute and step == 0:  # then step 0's masked shards run on exact K/V, and step 1 streams
        step0_rest = sum(s for s, st in zip(ctx.shard_s[shard:], ctx.shard_step[shard:]) if st == 0)
        ends["recompute"] = max(now + ctx.full_step_s + rest, streamed(now, ctx.later_bytes(shard, 1)))
        worst["recompute"] = ctx.local_end(now + ctx.full_step_s + step0_rest, 1)
        slack["recompute"] = step0_rest  # step 0 run exactly, then local: better than local from now
    if reuse_s is not None:  # (later shards can reuse too: no floor from the link)
        ends["reuse"] = now + reuse_s + rest
        worst["reuse"] = escape(now)
    if ctx.allow_local:
        ends["local"] = ctx.local_end(now, step)
        open_ = [k for k in ends if k != "local" and (worst[k] <= ctx.hard_s + slack.get(k, 0.0)
                                                        or ends[k] <= ctx.bound_s)]
    else:  # nothing to escape to: the bound cannot be kept, only the expected end
        open_ = list(ends)
    if not open_:
        return "local", ends
    free = [k for k in ("wait", "recompute") if k in open_
            and (k != "wait" or reuse_s is None or ctx.wait_is_free(shard, kept_error, wait_error))]
    if free and min(ends[k] for k in free) <= ctx.bound_s:
        return min(free, key=ends.get), ends
    return min(open_, key=lambda k: (ends[k], worst.get(k, ends[k]))), ends
