"""Bandwidth traces: loaders, synthetic profiles, exact byte/time integration.

A :class:`Trace` is a piecewise-constant downlink rate: ``mbps[i]`` holds on
``[edges[i], edges[i+1])`` seconds, and the trace repeats after ``duration``
(so a 600 s trace can drive an arbitrarily long run from any start offset).
1 Mbps = 1e6 bit/s = 125 000 bytes/s.

Files (see :func:`read_trace_file`):

* CSV with header ``time_s,mbps`` -- one row per sample;
* whitespace text, two columns ``time throughput_mbps`` (``#`` comments allowed).

A row at time ``t_i`` gives the rate from ``t_i`` until the next row; the last
row lasts as long as the previous interval (1 s for per-second traces). Times
are re-based so the trace starts at 0.

Synthetic profiles (:func:`synthetic`) let the project run with no file. They
are deterministic (fixed seeds) and calibrated to published statistics of the
Lumos5G / Narayanan et al. (SIGCOMM'21) traces that the paper uses:

=========  ============================================================  ====  ====  ====
name       what                                                          p10   p50   p90
=========  ============================================================  ====  ====  ====
``5g``     mmWave 5G walking, 600 s. Paper's 5G median is 545 Mbps;       45   545  1000
           the dataset's walking trace has p10 33 / p90 1030. Markov
           regime process (blocked / NLoS / LoS, dwell times of seconds)
           with AR(1) lognormal noise: deep drops on a seconds scale.
``lte``    LTE driving (dataset's 4G driving trace: 16 / 34.5 / 65.5).    16    35    65
``4g5g``   alternating 30 s segments of ``5g`` and ``lte``, 600 s,        --    --    --
           like the paper's mixed 4G+5G trace (each segment keeps its
           own profile's statistics).
``wifi``   Wi-Fi 6, 5 GHz, 80 MHz, stationary close range: high and       760   850   930
           steady (typical measured TCP goodput 800-900 Mbps).
=========  ============================================================  ====  ====  ====

Calibration: the raw process gives the temporal structure; a monotone map,
log-linear between the raw p10/p50/p90 and the targets, then pins those three
percentiles exactly while keeping the ordering (and so every drop and peak).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BYTES_PER_MBIT = 125_000.0

# Paper, §6: full FP16 cache transfer at the trace median takes 23 s, local full generation 13 s.
PAPER_FP16_TRANSFER_S = 23.0
PAPER_LOCAL_FULL_S = 13.0
# No link is faster than 1 Pbit/s; above this a rate is a typo or an attack (and overflows the byte
# integrals: fixed:1e308 made NaN byte counts).
MAX_MBPS = 1e9
MIN_MBPS = 1e-6  # 1 bit/s: a slower positive rate is a typo or a denormal (its byte integrals overflow); 0 is dead
MAX_DURATION_S = 1e12  # (~30 000 years) keeps every byte integral finite at MAX_MBPS


class TraceError(ValueError):
    """A trace file or spec that cannot be used; the message is one line."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Piecewise-constant rate: ``mbps[i]`` on ``[edges[i], edges[i+1])``, periodic."""

    edges: np.ndarray  # len n+1, edges[0] == 0, strictly increasing
    mbps: np.ndarray  # len n, >= 0
    name: str = "trace"

    def __post_init__(self) -> None:
        e = np.asarray(self.edges, dtype=np.float64)
        r = np.asarray(self.mbps, dtype=np.float64)
        if e.ndim != 1 or r.ndim != 1 or len(e) != len(r) + 1 or len(r) == 0:
            raise TraceError(f"{self.name}: need n rates and n+1 edges, got {len(r)} and {len(e)}")
        if e[0] != 0 or not np.all(np.diff(e) > 0):
            raise TraceError(f"{self.name}: edges must start at 0 and increase strictly")
        if not e[-1] <= MAX_DURATION_S:  # (also catches inf / nan: a last row at 1e308 s lasts to infinity)
            raise TraceError(f"{self.name}: a trace may last at most {MAX_DURATION_S:g} s, got {float(e[-1]):g}")
        if not np.all(np.isfinite(r)) or np.any(r < 0):
            raise TraceError(f"{self.name}: rates must be finite and >= 0")
        if np.any(r > MAX_MBPS):
            raise TraceError(f"{self.name}: rates must be at most {MAX_MBPS:g} Mbps, got {float(r.max()):g}")
        if np.any((r > 0) & (r < MIN_MBPS)):
            raise TraceError(f"{self.name}: a rate must be 0 (a dead link) or at least {MIN_MBPS:g} Mbps (1 bit/s), "
                             f"got {float(r[(r > 0) & (r < MIN_MBPS)][0]):g}")
        object.__setattr__(self, "edges", e)
        object.__setattr__(self, "mbps", r)
        # Cumulative bytes at each edge: makes every integral O(log n) and exact.
        cum = np.concatenate([[0.0], np.cumsum(r * BYTES_PER_MBIT * np.diff(e))])
        object.__setattr__(self, "_cum", cum)

    @classmethod
    def from_samples(cls, times: np.ndarray, mbps: np.ndarray, name: str = "trace") -> Trace:
        """Rows ``(t_i, rate_i)``: rate holds until the next row; the last row lasts one step."""
        t = np.asarray(times, dtype=np.float64)
        r = np.asarray(mbps, dtype=np.float64)
        last = t[-1] - t[-2] if len(t) > 1 else 1.0
        return cls(np.concatenate([t, [t[-1] + last]]) - t[0], r, name)

    @classmethod
    def constant(cls, mbps: float, duration: float = 1.0, name: str | None = None) -> Trace:
        return cls(np.array([0.0, duration]), np.array([float(mbps)]), name or f"fixed:{mbps:g}")

    # --- basic properties -------------------------------------------------------------------
    @property
    def duration(self) -> float:
        return float(self.edges[-1])

    @property
    def total_bytes(self) -> float:
        """Bytes deliverable over one period of the trace."""
        return float(self._cum[-1])  # type: ignore[attr-defined]

    def percentile(self, q: float) -> float:
        """Time-weighted percentile of the rate (Mbps); ``q`` in [0, 100]."""
        w = np.diff(self.edges)
        return float(np.percentile(self.mbps, q, weights=w, method="inverted_cdf"))

    @property
    def median_mbps(self) -> float:
        return self.percentile(50)

    @property
    def typical_mbps(self) -> float:
        """The rate a regime is set from: the median, or for a trace down more than half the time the
        median of its non-zero samples (a median of 0 would scale it to infinity); 0 only if the
        trace is 0 throughout."""
        if self.median_mbps > 0:
            return self.median_mbps
        up = self.mbps > 0
        if not up.any():
            return 0.0
        w = np.diff(self.edges)[up]
        return float(np.percentile(self.mbps[up], 50, weights=w, method="inverted_cdf"))

    @property
    def mean_mbps(self) -> float:
        return self.total_bytes / BYTES_PER_MBIT / self.duration

    def stats(self) -> dict[str, float]:
        return {
            "duration_s": self.duration,
            "mean_mbps": self.mean_mbps,
            **{f"p{q}_mbps": self.percentile(q) for q in (10, 50, 90)},
        }

    def rate_at(self, t: float | np.ndarray) -> np.ndarray | float:
        """Rate (Mbps) at time ``t`` (wraps around)."""
        tt = np.mod(t, self.duration)
        idx = np.searchsorted(self.edges, tt, side="right") - 1
        out = self.mbps[np.clip(idx, 0, len(self.mbps) - 1)]
        return float(out) if np.ndim(out) == 0 else out

    # --- exact integration ------------------------------------------------------------------
    def _cum_at(self, t: float) -> float:
        """Bytes deliverable on [0, t], t >= 0, over the periodic extension."""
        cycles, rem = divmod(t, self.duration)
        i = int(np.searchsorted(self.edges, rem, side="right")) - 1
        i = min(max(i, 0), len(self.mbps) - 1)
        within = self._cum[i] + (rem - self.edges[i]) * self.mbps[i] * BYTES_PER_MBIT  # type: ignore[attr-defined]
        return cycles * self.total_bytes + float(within)

    def bytes_between(self, t0: float, t1: float) -> float:
        """Bytes the link delivers on [t0, t1] (trace time, wraps around)."""
        if t1 < t0:
            raise ValueError(f"t1 ({t1}) < t0 ({t0})")
        base = math.floor(t0 / self.duration) * self.duration  # keep both arguments >= 0
        return self._cum_at(t1 - base) - self._cum_at(t0 - base)

    def time_to_send(self, nbytes: float, start_t: float = 0.0) -> float:
        """Seconds needed to deliver ``nbytes`` starting at trace time ``start_t`` (exact)."""
        if nbytes <= 0:
            return 0.0
        if self.total_bytes <= 0:  # a dead link (zero is a bandwidth): nothing ever arrives
            return math.inf
        base = math.floor(start_t / self.duration) * self.duration
        s = start_t - base
        target = self._cum_at(s) + nbytes
        cycles, rem = divmod(target, self.total_bytes)
        if rem == 0 and cycles > 0:  # land at the end of the previous period, not after its idle tail
            cycles, rem = cycles - 1, self.total_bytes
        cum = self._cum  # type: ignore[attr-defined]
        # First edge with cum >= rem; zero-rate intervals make plateaus, and we want their start.
        j = int(np.searchsorted(cum, rem, side="left"))
        if j < len(cum) and cum[j] == rem:
            t = float(self.edges[j])
        else:
            i = j - 1
            t = float(self.edges[i] + (rem - cum[i]) / (self.mbps[i] * BYTES_PER_MBIT))
        return cycles * self.duration + t - s

    # --- derived traces ---------------------------------------------------------------------
    def scaled(self, k: float) -> Trace:
        if not k > 0:
            raise TraceError(f"scale must be > 0, got {k}")
        return Trace(self.edges, self.mbps * k, f"{self.name}*{k:g}")

    def dead_seconds(self, start: float, duration: float) -> float:
        """Seconds of a dead link (rate 0) in ``[start, start + duration)`` (wraps)."""
        if not duration > 0:
            return 0.0
        edges, mbps = self.steps(start, duration)
        return float(np.sum(np.diff(edges)[mbps <= 0]))

    def dead_stretches(self, dead_mbps: float = 0.0) -> list[tuple[float, float]]:
        """``(begin, end)`` of every stretch whose rate is at most ``dead_mbps``, in order."""
        dead = self.mbps <= dead_mbps
        out, i, n = [], 0, len(self.mbps)
        while i < n:
            if not dead[i]:
                i += 1
                continue
            j = i
            while j < n and dead[j]:
                j += 1
            out.append((float(self.edges[i]), float(self.edges[j])))
            i = j
        return out

    def with_retransmission_stalls(self, rto_s: float = 0.2, dead_mbps: float = 0.0, since: float = 0.0) -> Trace:
        """The trace as a TCP transfer that is in flight through every outage sees it: a dead stretch (rate ≤
        ``dead_mbps``) lasts until the first retransmission after the link is back, the retransmission timer
        starting at ``rto_s`` when the stretch begins and doubling after each unanswered try (so a 0.8 s outage
        holds the transfer 1.4 s, a 1.0 s one 1.4 s, a 2 s one 3.0 s). An application-paced link resumes the
        moment the rate does; a kernel-shaped one does not (docs/results/issue35). ``since``: when the first
        transfer starts (an edit's start) — only an outage that begins later catches a transfer in flight; one
        under way by then is the trace as it is (on the kernel link a request sent into it trickles through at
        the floor rate and resumes with the link: no loss, no timer)."""
        if not rto_s > 0:
            raise TraceError(f"rto_s must be > 0, got {rto_s}")
        stalls = []  # (from, to) the rate is 0 in the result
        for z0, z1 in self.dead_stretches(dead_mbps):
            if z0 < since:
                continue
            wait = rto_s
            while wait < z1 - z0 - 1e-12:  # tries at z0 + rto, z0 + 3·rto, z0 + 7·rto, …
                wait = 2 * wait + rto_s
            stalls.append((z0, min(z0 + wait, self.duration)))
        if not stalls:
            return self
        cuts = np.unique(np.concatenate([self.edges, [t for st in stalls for t in st]]))
        cuts = cuts[cuts <= self.duration]
        mids = (cuts[:-1] + cuts[1:]) / 2
        rates = np.asarray(self.rate_at(mids), dtype=np.float64)
        for a, b in stalls:
            rates[(mids >= a) & (mids < b)] = 0.0
        return Trace(cuts, rates, f"{self.name} with TCP stalls")

    def steps(self, start: float, duration: float) -> tuple[np.ndarray, np.ndarray]:
        """The rate seen from ``start`` for ``duration`` seconds (wraps), re-based to 0, as ``(edges,
        mbps)``: a step function that may be all zero (an outage), unlike a :class:`Trace`."""
        if not duration > 0:
            raise TraceError(f"window duration must be > 0, got {duration}")
        base = math.floor(start / self.duration) * self.duration
        s = start - base
        n_periods = math.ceil((s + duration) / self.duration) + 1
        all_edges = (self.edges[:-1][None, :] + self.duration * np.arange(n_periods)[:, None]).ravel()
        inner = all_edges[(all_edges > s) & (all_edges < s + duration)]
        edges = np.concatenate([[s], inner, [s + duration]])
        return edges - s, np.asarray(self.rate_at(edges[:-1]))  # each sub-interval starts on an edge

    def window(self, start: float, duration: float) -> Trace:
        """The trace seen from ``start`` for ``duration`` seconds (wraps), re-based to 0."""
        return Trace(*self.steps(start, duration), f"{self.name}@{start:g}+{duration:g}")


# --- files ------------------------------------------------------------------------------------
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def read_trace_file(path: str | Path) -> Trace:
    """Load a CSV (``time_s,mbps`` header) or two-column whitespace trace file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{p}: cannot read trace file ({type(e).__name__}: {e})") from None
    return parse_trace_text(text, name=p.stem, where=str(p))


def parse_trace_text(text: str, name: str = "trace", where: str | None = None) -> Trace:
    """A trace from the text of a trace file; errors name ``where`` (default: ``name``) and a line number."""
    p = where or name
    lines = [(n, ln.split("#", 1)[0].strip()) for n, ln in enumerate(text.splitlines(), 1)]
    lines = [(n, ln) for n, ln in lines if ln]
    if not lines:
        raise TraceError(f"{p}: empty trace file")
    first = lines[0][1]
    if "," in first:
        header = [c.strip().lower() for c in first.split(",")]
        if header != ["time_s", "mbps"]:
            raise TraceError(f"{p}:{lines[0][0]}: CSV header must be 'time_s,mbps', got {first[:60]!r}")
        rows, sep = lines[1:], ","
    else:
        rows, sep = lines, None
    if not rows:
        raise TraceError(f"{p}: trace file has no data rows")
    times, rates = [], []
    for n, ln in rows:
        cols = [c.strip() for c in ln.split(sep)]
        if len(cols) != 2:
            raise TraceError(f"{p}:{n}: expected 2 columns (time, Mbps), got {len(cols)}: {ln[:60]!r}")
        if not all(re.fullmatch(_NUM, c) for c in cols):
            raise TraceError(f"{p}:{n}: non-numeric value: {ln[:60]!r}")
        t, r = float(cols[0]), float(cols[1])
        if not (math.isfinite(t) and math.isfinite(r)):
            raise TraceError(f"{p}:{n}: number out of range: {ln[:60]!r}")
        if r < 0:
            raise TraceError(f"{p}:{n}: negative throughput {r:g}")
        if times and t <= times[-1]:
            raise TraceError(f"{p}:{n}: time {t:g} does not increase (previous {times[-1]:g})")
        times.append(t)
        rates.append(r)
    return Trace.from_samples(np.array(times), np.array(rates), name=name)


def write_trace_csv(trace: Trace, path: str | Path) -> None:
    """Write ``time_s,mbps`` rows (one per interval)."""
    rows = "\n".join(f"{t:.6g},{r:.6g}" for t, r in zip(trace.edges[:-1], trace.mbps))
    Path(path).write_text(f"time_s,mbps\n{rows}\n", encoding="utf-8")


# --- synthetic profiles -----------------------------------------------------------------------
def _calibrate(x: np.ndarray, targets: tuple[float, float, float]) -> np.ndarray:
    """Monotone map pinning p10/p50/p90 of ``x`` to ``targets``, log-linear in between/beyond."""
    lx = np.log(x)
    src = np.percentile(lx, [10, 50, 90], method="inverted_cdf")
    dst = np.log(np.asarray(targets))
    lo = (dst[1] - dst[0]) / (src[1] - src[0])
    hi = (dst[2] - dst[1]) / (src[2] - src[1])
    y = np.where(lx < src[1], dst[1] + (lx - src[1]) * lo, dst[1] + (lx - src[1]) * hi)
    return np.exp(y)


def _ar1(rng: np.random.Generator, n: int, phi: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) with marginal std ``sigma`` (correlated noise on a seconds scale)."""
    e = rng.normal(0.0, sigma * math.sqrt(1 - phi * phi), n)
    out = np.empty(n)
    out[0] = rng.normal(0.0, sigma)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + e[i]
    return out


def _mmwave(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Regimes: blocked (body/building blockage, fallback), NLoS reflection, LoS.
    level = np.array([40.0, 350.0, 900.0])
    mean_dwell = np.array([3.0, 5.0, 9.0])  # seconds
    nxt = np.array([[0.0, 0.7, 0.3], [0.35, 0.0, 0.65], [0.25, 0.75, 0.0]])
    states = np.empty(n, dtype=int)
    s, i = 2, 0
    while i < n:
        d = max(1, int(round(rng.exponential(mean_dwell[s]))))
        states[i : i + d] = s
        i += d
        s = int(rng.choice(3, p=nxt[s]))
    noise = _ar1(rng, n, phi=0.75, sigma=0.25)
    return level[states] * np.exp(noise)


def _lte(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 35.0 * np.exp(_ar1(rng, n, phi=0.85, sigma=0.5))


def _wifi(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 850.0 * np.exp(_ar1(rng, n, phi=0.7, sigma=0.06))


SYNTHETIC_TARGETS: dict[str, tuple[float, float, float]] = {
    "5g": (45.0, 545.0, 1000.0),
    "lte": (16.0, 35.0, 65.0),
    "wifi": (760.0, 850.0, 930.0),
}
SYNTHETIC_NAMES = ("5g", "4g5g", "wifi", "lte")


@functools.lru_cache(maxsize=None)
def synthetic(name: str, duration_s: int = 600, seed: int = 0) -> Trace:
    """Deterministic synthetic profile (1 s resolution); see the module docstring."""
    n = int(duration_s)
    if name == "4g5g":
        fiveg, lte = synthetic("5g", n, seed).mbps, synthetic("lte", n, seed).mbps
        use_5g = (np.arange(n) // 30) % 2 == 0  # 30 s of 5G, then 30 s of LTE, ...
        rates = np.where(use_5g, fiveg, lte)
    elif name in SYNTHETIC_TARGETS:
        gen = {"5g": _mmwave, "lte": _lte, "wifi": _wifi}[name]
        rates = _calibrate(gen(n, 1000 + seed), SYNTHETIC_TARGETS[name])
    else:
        raise TraceError(f"unknown synthetic profile {name[:40]!r} (known: {', '.join(SYNTHETIC_NAMES)})")
    return Trace(np.arange(n + 1, dtype=np.float64), np.round(rates, 1), name)


def load_trace(spec: str | Path, scale: float = 1.0) -> Trace:
    """A trace from a profile name (``5g``, ``4g5g``, ``wifi``, ``lte``), ``fixed:MBPS``, or a path."""
    s = str(spec).strip()
    if s in SYNTHETIC_NAMES:
        tr = synthetic(s)
    elif s.startswith("fixed:"):
        try:
            mbps = float(s[len("fixed:") :])
        except ValueError:
            raise TraceError(f"bad fixed trace {s[:60]!r}: expected fixed:<Mbps>, e.g. fixed:100") from None
        if not (mbps > 0 and math.isfinite(mbps)):
            raise TraceError(f"bad fixed trace {s[:60]!r}: rate must be a positive number")
        tr = Trace.constant(mbps)
    else:
        p = Path(s)
        try:
            is_file = p.is_file()
        except (OSError, ValueError):  # a name too long for the file system, or with a NUL in it
            is_file = False
        if not is_file:
            raise TraceError(
                f"trace {s[:80]!r} is neither a profile ({', '.join(SYNTHETIC_NAMES)}), fixed:<Mbps>, nor a file"
            )
        tr = read_trace_file(p)
    return tr if scale == 1.0 else tr.scaled(scale)


def paper_regime_scale(trace: Trace, fp16_cache_bytes: float, local_full_s: float) -> float:
    """Trace scale putting this machine in the paper's regime.

    The paper's 5G setting has "full FP16 cache transfer at the trace median" = 23 s against
    "local full generation" = 13 s. With our model/cache sizes, scaling the trace by

        scale = fp16_cache_bytes * 8 / (median_bps * local_full_s * 23/13)

    makes ``fp16_cache_bytes / (scale * median) == local_full_s * 23/13``, i.e. the same ratio,
    so transfer and compute pressure relate as in the paper whatever the absolute speeds. A trace
    that is down more than half the time has a median of 0: the median of its non-zero samples
    stands in for it (:attr:`Trace.typical_mbps`).
    """
    if fp16_cache_bytes <= 0 or local_full_s <= 0:
        raise ValueError("fp16_cache_bytes and local_full_s must be > 0")
    median_bps = trace.typical_mbps * 1e6
    if median_bps <= 0:
        return 1.0  # a dead link: there is no rate to scale
    return fp16_cache_bytes * 8 / (median_bps * local_full_s * PAPER_FP16_TRANSFER_S / PAPER_LOCAL_FULL_S)
