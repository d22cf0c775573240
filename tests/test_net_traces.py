"""Traces: loaders, garbage files, synthetic calibration, exact integration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sakura.net.traces import (
    Trace,
    TraceError,
    load_trace,
    paper_regime_scale,
    read_trace_file,
    synthetic,
    write_trace_csv,
)

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_csv_and_text_loaders_agree(tmp_path: Path) -> None:
    csv = _write(tmp_path, "a.csv", "time_s,mbps\n1,10\n2,20\n3,0\n4,40\n")
    txt = _write(tmp_path, "a.txt", "# time throughput\n1 10\n2\t20\n\n3 0  # outage\n4 40\n")
    a, b = read_trace_file(csv), read_trace_file(txt)
    assert np.array_equal(a.edges, [0, 1, 2, 3, 4]) and np.array_equal(a.mbps, [10, 20, 0, 40])
    assert np.array_equal(a.edges, b.edges) and np.array_equal(a.mbps, b.mbps)
    assert a.bytes_between(0, 4) == pytest.approx(70 * 125_000)
    out = tmp_path / "round.csv"
    write_trace_csv(a, out)
    assert np.array_equal(read_trace_file(out).mbps, a.mbps)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("time_s,mbps\n", "no data rows"),
        ("time_s,mbps\n1,abc\n", "non-numeric"),
        ("time_s,mbps\n1,nan\n", "non-numeric"),
        ("time_s,mbps\n1,10\n2,-5\n", "negative"),
        ("time_s,mbps\n1,10\n1,20\n", "does not increase"),
        ("time_s,mbps\n2,10\n1,20\n", "does not increase"),
        ("time,bandwidth\n1,10\n", "header"),
        ("1 2 3\n", "2 columns"),
        ("1\n", "2 columns"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "cannot read"),
    ],
)
def test_garbage_files_give_one_line_trace_errors(tmp_path: Path, text: str | bytes, needle: str) -> None:
    p = _write(tmp_path, "bad.trace", text)
    with pytest.raises(TraceError) as ei:
        read_trace_file(p)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg and str(p) in msg
    assert isinstance(ei.value, ValueError)


def test_load_trace_specs(tmp_path: Path) -> None:
    assert load_trace("fixed:100").median_mbps == 100
    assert load_trace("fixed:100", scale=0.5).median_mbps == 50
    assert load_trace("5g").duration == 600
    p = _write(tmp_path, "t.csv", "time_s,mbps\n0,5\n1,6\n")
    assert load_trace(str(p)).mbps.tolist() == [5, 6]
    for bad in ("fixed:abc", "fixed:0", "fixed:-3", "nope", str(tmp_path / "missing.csv")):
        with pytest.raises(TraceError):
            load_trace(bad)


def _stats(tr: Trace) -> tuple[float, float, float]:
    return tr.percentile(10), tr.median_mbps, tr.percentile(90)


def test_synthetic_5g_matches_calibration_targets() -> None:
    tr = synthetic("5g")
    p10, p50, p90 = _stats(tr)
    assert tr.duration == 600
    assert 30 <= p10 <= 60 and abs(p50 - 545) / 545 < 0.05 and abs(p90 - 1000) / 1000 < 0.1
    r = tr.mbps
    # Deep drops (below a tenth of the median) happen often and last seconds, not minutes.
    deep = r < 0.1 * p50
    assert 0.05 < deep.mean() < 0.3
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], deep.astype(int), [0]]))))[::2]
    assert runs.max() <= 20 and len(runs) >= 10
    # Strong fluctuation on a seconds scale: many 1 s steps change the rate by 2x or more.
    assert (np.abs(np.diff(np.log(np.maximum(r, 1e-3)))) > np.log(2)).mean() > 0.05


def test_synthetic_lte_wifi_and_mixed() -> None:
    p10, p50, p90 = _stats(synthetic("lte"))
    assert abs(p10 - 16) < 2 and abs(p50 - 35) < 2 and abs(p90 - 65) < 4
    p10, p50, p90 = _stats(synthetic("wifi"))
    assert 800 <= p50 <= 900 and p90 / p10 < 1.4
    mixed = synthetic("4g5g")
    assert mixed.duration == 600
    for k in range(0, 600, 60):  # 30 s of 5G, then 30 s of LTE
        assert np.array_equal(mixed.window(k, 30).mbps, synthetic("5g").window(k, 30).mbps)
        assert np.array_equal(mixed.window(k + 30, 30).mbps, synthetic("lte").window(k + 30, 30).mbps)
    assert 30 < mixed.median_mbps < 200  # low-bandwidth mixed scenario


def test_synthetic_is_deterministic() -> None:
    fresh = synthetic.__wrapped__("5g")  # bypass the cache
    assert np.array_equal(fresh.mbps, synthetic("5g").mbps)
    assert not np.array_equal(synthetic.__wrapped__("5g", seed=1).mbps, fresh.mbps)


def _brute_time_to_send(tr: Trace, nbytes: float, start: float) -> float:
    """Walk the trace interval by interval (linear scan, no cumulative table)."""
    t, left = start, nbytes
    while True:
        base = (t // tr.duration) * tr.duration
        i = int(np.searchsorted(tr.edges, t - base, side="right"))
        edge = base + tr.edges[i]
        rate = float(tr.rate_at(t)) * 125_000
        if rate * (edge - t) >= left:
            return t + left / rate - start
        left -= rate * (edge - t)
        t = edge


def test_time_to_send_is_exact() -> None:
    tr = Trace.from_samples(np.arange(6.0), np.array([8.0, 0.0, 16.0, 4.0, 0.0, 2.0]))
    assert tr.time_to_send(1_000_000, 0) == pytest.approx(1.0)  # 8 Mbps for 1 s
    assert tr.time_to_send(1_000_001, 0) == pytest.approx(2.0 + 1 / 2_000_000)  # outage skipped
    assert tr.time_to_send(0, 3.3) == 0
    rng = np.random.default_rng(0)
    for _ in range(40):
        start = float(rng.uniform(0, 12))
        nbytes = float(rng.uniform(1, 3.5 * tr.total_bytes))  # includes wrapping around the end
        exact = tr.time_to_send(nbytes, start)
        assert exact == pytest.approx(_brute_time_to_send(tr, nbytes, start), rel=1e-9, abs=1e-9)
        assert tr.bytes_between(start, start + exact) == pytest.approx(nbytes, rel=1e-9)
    g = synthetic("5g")
    for start, nbytes in [(0.0, 1e6), (12.3, 3e8), (599.5, 5e7), (250.0, 2.5 * g.total_bytes)]:
        assert g.time_to_send(nbytes, start) == pytest.approx(_brute_time_to_send(g, nbytes, start), rel=1e-9)


def test_bytes_between_window_scaled() -> None:
    tr = synthetic("5g")
    t = np.linspace(100, 130, 300_001)
    numeric = np.sum(np.asarray(tr.rate_at(t[:-1])) * np.diff(t)) * 125_000
    assert tr.bytes_between(100, 130) == pytest.approx(numeric, rel=1e-4)
    w = tr.window(590.5, 20)  # wraps past the end
    assert w.duration == pytest.approx(20)
    assert w.bytes_between(0, 20) == pytest.approx(tr.bytes_between(590.5, 610.5))
    assert w.rate_at(0.2) == tr.rate_at(590.7) and w.rate_at(10.2) == tr.rate_at(0.7)
    assert tr.scaled(0.25).bytes_between(3, 9) == pytest.approx(0.25 * tr.bytes_between(3, 9))
    assert tr.bytes_between(10, 10 + 3 * 600) == pytest.approx(3 * tr.total_bytes)


def test_paper_regime_scale() -> None:
    tr = synthetic("5g")
    fp16, local_s = 3.0e9, 20.0
    k = paper_regime_scale(tr, fp16, local_s)
    transfer_s = fp16 * 8 / (tr.scaled(k).median_mbps * 1e6)
    assert transfer_s / local_s == pytest.approx(23 / 13)


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=f"real traces not present at {SHARED_TRACES}")
def test_real_traces_load_with_published_stats() -> None:
    w = read_trace_file(SHARED_TRACES / "5g-walking-603s.csv")
    assert w.duration == 603 and _stats(w) == (33, 605, 1030)
    lte = read_trace_file(SHARED_TRACES / "4g-driving-250s.csv")
    assert _stats(lte) == (16, 34.5, 65.5)
    # The synthetic profile sits close to the real walking trace it imitates.
    s = synthetic("5g")
    assert abs(s.median_mbps - w.median_mbps) / w.median_mbps < 0.15
    assert abs(s.mean_mbps - w.mean_mbps) / w.mean_mbps < 0.15


def test_a_dead_link_is_a_trace(tmp_path: Path) -> None:
    """Zero is a bandwidth: a trace that is 0 throughout loads, delivers nothing, and never divides by it."""
    trace = read_trace_file(_write(tmp_path, "dead.trace", "1 0\n2 0\n"))
    assert trace.total_bytes == 0 and trace.bytes_between(0.0, 5.0) == 0.0
    assert trace.time_to_send(1, 0.3) == float("inf")
    assert paper_regime_scale(trace, 1e6, 2.0) == 1.0


def test_a_trace_lasting_to_infinity_is_refused(tmp_path):
    """Found by the property test: a last row at 1e308 s made the trace's end infinite and its byte integral NaN."""
    from sakura.net.traces import TraceError, load_trace

    path = tmp_path / "far.csv"
    path.write_text("time_s,mbps\n0,0\n1e308,0\n")
    with pytest.raises(TraceError, match="at most"):
        load_trace(str(path))


def test_an_outage_lasts_until_the_first_retransmission_after_it() -> None:
    """The TCP view of a trace: a dead stretch holds a transfer until the retransmission timer (0.2 s, doubling)
    next fires after the link is back; the bytes outside the outages are the trace's own."""
    t = Trace(np.array([0.0, 1.0, 1.8, 3.0, 4.0, 6.0, 7.0]), np.array([10.0, 0.0, 10.0, 0.0, 0.0, 10.0]))
    s = t.with_retransmission_stalls(rto_s=0.2)
    assert s.rate_at(1.9) == 0.0 and s.rate_at(2.39) == 0.0 and s.rate_at(2.41) == 10.0  # 0.8 s dead: back at 1.4 s
    assert s.rate_at(5.99) == 0.0 and s.rate_at(6.01) == 10.0  # 3 s dead: the try at 3.0 s finds the link back
    assert s.bytes_between(0.0, 1.0) == t.bytes_between(0.0, 1.0)
    assert s.bytes_between(2.4, 3.0) == pytest.approx(t.bytes_between(2.4, 3.0))
    assert s.time_to_send(1e5, 0.95) == pytest.approx(2.4 - 0.95 + (1e5 - 0.05 * 10 * 125_000) / (10 * 125_000))
    # from an edit's start: only an outage that begins later catches a transfer in flight
    late = t.with_retransmission_stalls(rto_s=0.2, since=1.5)
    assert late.rate_at(1.85) == 10.0 and late.rate_at(5.99) == 0.0 and late.rate_at(6.01) == 10.0
    assert t.with_retransmission_stalls(rto_s=0.2, since=3.5).rate_at(6.01) == 10.0  # under way: as it is
    steady = Trace.constant(5.0)
    assert steady.with_retransmission_stalls() is steady  # no outage: the same link
