"""Runtime monitor (paper §4.3.1): the effective transfer rate, and how fast this device rebuilds.

The rate is bytes over *active* receive time (the time a transfer was actually in flight), not
wall time, so idle gaps while the buffer is full do not read as a slow link. It is the harmonic
mean of the last few transfers' rates: a single fast burst cannot inflate it, while a drop shows
up at once — the safe side for deadlines.

Three estimators (``ESTIMATORS``): ``harmonic`` (the paper's), ``robust-mpc`` (Yin et al., SIGCOMM'15, the
default): the same harmonic mean divided by ``1 + e``, where ``e`` is the largest relative error of the last five
predictions — it backs off while the link has been surprising it, and returns to the harmonic mean once predictions
come true again —, and ``robust-mpc-over``: the same, counting only the predictions that were too high (a link that
turned out faster than predicted put no deadline at risk, so it is no reason to ask for less).

R̂ folds a request's round trip into the rate when the link was idle at the request (the proportional model the
per-unit window rule and the baselines budget with). The plan-ahead policy models the link as the simulated clock
does — a request's bytes start a round trip after it is sent, or when the link is free, whichever is later, then
flow at the link's rate — so the monitor also keeps the two apart: :attr:`RuntimeMonitor.link_rate_bps` (bytes over
first byte → last byte, discounted by its own prediction errors) and :attr:`RuntimeMonitor.round_trip_s` (request →
first byte, from requests that found the link idle).

A received shard is not usable until it is rebuilt (``A·B + μ``), so a level's cost to a deadline is
its transfer *and* its rebuild. :class:`RebuildRate` learns seconds per unit of rebuild work
(``Level.work``, multiply-accumulates) from this edit's own rebuilds, as the rate is learnt from its
own transfers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class TransferSample:
    nbytes: int
    active_s: float


ESTIMATORS = ("harmonic", "robust-mpc", "robust-mpc-over")
# robust-mpc had the lower SAKURA p90 on all four measured traces (fs, 20 offsets each, paper regime,
# anytime shards: 0.51 vs 0.59 s 4G driving, 0.50 vs 0.61 4G+5G, 0.49 vs 0.58 5G driving, 0.53 vs
# 0.63 5G walking; masked PSNR −0.1 … −0.3 dB): `sakura bench --figure estimators`. harmonic and
# robust-mpc-over (no clear win over it: docs/results/issue32/policy10) stay as ablations.
DEFAULT_ESTIMATOR = "robust-mpc"
# Zero is a bandwidth (a trace can start in an outage): an initial estimate at or below this is
# floored to it, so the first choices take the smallest levels until transfers are measured.
MIN_INITIAL_BPS = 1e3
# robust-mpc's discount counts a prediction's relative error up to this (at most halving the harmonic mean). A larger
# miss is the link changing regime — a trough, or one transfer held through it by TCP's retransmission backoff —, which
# the harmonic mean already carries; counted whole (a 10 Mbit/s prediction against a transfer that took 5 s through a
# 0.8 s trough: error 65) it held the estimate at 1/66 of the harmonic mean for the next five transfers after the link
# was back (measured on the kernel-shaped link, docs/results/issue35/trough-*.png).
MAX_PREDICTION_ERROR = 1.0


class RebuildRate:
    """Seconds per unit of rebuild work: total time over total work of the last ``window`` rebuilds
    that had work. Proportional, not affine: the fixed part of a rebuild (CRC checks, launching) is
    charged per work unit, which over-prices small levels when only those were seen — the side of
    choosing a smaller level, when the link is poor anyway. No rebuild seen yet: ``prior`` (0 = free)."""

    def __init__(self, prior_s_per_work: float = 0.0, window: int = 8):
        self.prior = max(0.0, float(prior_s_per_work))
        self.samples: deque[tuple[float, float]] = deque(maxlen=window)

    def observe(self, work: float, seconds: float) -> None:
        if work > 0 and seconds >= 0:
            self.samples.append((float(work), float(seconds)))

    @property
    def s_per_work(self) -> float:
        samples = list(self.samples)  # a copy: the rebuild thread appends while the requester reads
        if not samples:
            return self.prior
        return sum(s for _, s in samples) / sum(w for w, _ in samples)

    def seconds(self, work: float) -> float:
        """Predicted rebuild time of ``work``."""
        return self.s_per_work * work


class RuntimeMonitor:
    def __init__(self, initial_bps: float, window: int = 4, min_active_s: float = 1e-4,
                 estimator: str = DEFAULT_ESTIMATOR, initial_round_trip_s: float = 0.0,
                 rebuild_prior_s_per_work: float = 0.0):
        if estimator not in ESTIMATORS:
            raise ValueError(f"unknown rate estimator {estimator!r}; choose from {', '.join(ESTIMATORS)}")
        self.initial_bps = initial_bps if initial_bps > MIN_INITIAL_BPS else MIN_INITIAL_BPS  # also NaN
        self.samples: deque[TransferSample] = deque(maxlen=window)
        self.link_samples: deque[TransferSample] = deque(maxlen=window)  # first byte → last byte
        self.link_errors: deque[float] = deque(maxlen=5)  # (robust-mpc) of the link rate's predictions
        self.round_trips: deque[float] = deque(maxlen=5)  # request → first byte, the link idle at the request
        self.initial_round_trip_s = max(0.0, initial_round_trip_s)  # (the device's calibration: before any here)
        self.errors: deque[float] = deque(maxlen=5)  # relative errors of the last predictions (robust-mpc)
        self.min_active_s = min_active_s
        self.estimator = estimator
        self._link_free_at = float("-inf")  # when the previous transfer's last byte arrived
        self.rebuild = RebuildRate(rebuild_prior_s_per_work)  # (the device's calibration: before any here)

    def observe(self, nbytes: int, t_request: float, t_last_byte: float, t_first_byte: float | None = None) -> float:
        """A completed transfer, by its timestamps. With several requests in flight a request waits
        for the one before it; only the time from then (or from its own request, if later) to its last
        byte is its active time, so pipelining does not read as a slow link. Both clocks call this.
        ``t_first_byte`` (when the link started on its bytes) also teaches the link's own rate and round trip."""
        active = t_last_byte - max(t_request, self._link_free_at)
        self.record_transfer(nbytes, active)
        if t_first_byte is not None and nbytes > 0:
            busy = t_last_byte - max(t_first_byte, self._link_free_at)
            self._learn(self.link_samples, self.link_errors, TransferSample(nbytes, max(busy, self.min_active_s)))
            if t_request >= self._link_free_at:  # (a request sent while the link was busy hid its round trip)
                self.round_trips.append(max(0.0, min(t_first_byte, t_last_byte) - t_request))
        self._link_free_at = max(self._link_free_at, t_last_byte)
        return max(active, self.min_active_s)

    def record_transfer(self, nbytes: int, active_s: float) -> None:
        if nbytes > 0:
            self._learn(self.samples, self.errors, TransferSample(nbytes, max(active_s, self.min_active_s)))

    def _learn(self, kept: deque[TransferSample], errors: deque[float], sample: TransferSample) -> None:
        if kept:  # a prediction made from measurements (not the nominal initial rate) was checked
            actual = 8 * sample.nbytes / sample.active_s
            miss = self._estimate(kept, errors) - actual
            if self.estimator == "robust-mpc-over":
                miss = max(miss, 0.0)
            errors.append(min(abs(miss) / actual, MAX_PREDICTION_ERROR))
        kept.append(sample)

    @property
    def rate_bps(self) -> float:
        """R̂ in bits per second: harmonic mean of recent per-transfer rates (initial estimate if none)."""
        return self._estimate(self.samples, self.errors)

    @property
    def link_rate_bps(self) -> float:
        """The link's rate once a request's bytes flow (its round trip apart), estimated as R̂ is."""
        return self._estimate(self.link_samples, self.link_errors)

    @property
    def round_trip_s(self) -> float:
        """A request's wait for its first byte on an idle link: the median of the last few (before any, the one
        the device's calibration measured on earlier edits)."""
        trips = sorted(self.round_trips)
        return trips[len(trips) // 2] if trips else self.initial_round_trip_s

    def _estimate(self, kept: deque[TransferSample], errors: deque[float]) -> float:
        if not kept:
            return self.initial_bps
        samples = list(kept)  # a copy: the collector thread appends while the requester reads
        harmonic = len(samples) / sum(s.active_s / (8 * s.nbytes) for s in samples)
        if self.estimator != "harmonic" and errors:
            return harmonic / (1 + max(errors))
        return harmonic
