"""Trace shaper: exact pacing in simulated time, accurate pacing in wall time."""

from __future__ import annotations

import asyncio
import time

import pytest
from pacing import assert_paced

from sakura.net.clock import RealClock, SimClock
from sakura.net.shaping import BUCKET_BYTES, RateSpec, TraceShaper
from sakura.net.traces import TraceError, load_trace, synthetic


def test_sim_clock_pacing_follows_trace_integral_exactly() -> None:
    tr, start, n = synthetic("5g"), 12.0, 40_000_000
    clock = SimClock(100.0)
    shaper = TraceShaper(tr, start, clock=clock)
    sent = 0
    for chunk in shaper.send_chunks(bytes(n)):
        sent += len(chunk)
        allowed = tr.bytes_between(start, shaper.trace_time()) + BUCKET_BYTES
        assert sent <= allowed + 1  # never ahead of the link
    assert sent == n
    assert clock.now() - 100.0 == pytest.approx(tr.time_to_send(n - BUCKET_BYTES, start), rel=1e-9)


def test_idle_credit_is_capped_at_bucket_depth() -> None:
    tr, clock = load_trace("fixed:80"), SimClock()
    shaper = TraceShaper(tr, 0.0, clock=clock)
    list(shaper.send_chunks(bytes(1_000_000)))
    clock.sleep(10.0)  # idle link: 100 MB of capacity passes unused
    t = clock.now()
    list(shaper.send_chunks(bytes(1_000_000)))
    assert clock.now() - t == pytest.approx((1_000_000 - BUCKET_BYTES) * 8 / 80e6, rel=1e-6)


def test_async_variant_in_sim_time() -> None:
    tr, clock = synthetic("4g5g"), SimClock()
    shaper = TraceShaper(tr, 25.0, clock=clock)

    async def go() -> int:
        return sum([len(c) async for c in shaper.asend_chunks(bytes(3_000_000))])

    assert asyncio.run(go()) == 3_000_000
    assert clock.now() == pytest.approx(tr.time_to_send(3_000_000 - BUCKET_BYTES, 25.0), rel=1e-9)


def test_wall_clock_pacing_fixed_80mbps() -> None:
    n = 2_000_000  # 0.2 s at 80 Mbps
    shaper = TraceShaper(load_trace("fixed:80"), clock=RealClock())
    t = time.monotonic()
    assert sum(len(c) for c in shaper.send_chunks(bytes(n))) == n
    took = time.monotonic() - t
    assert_paced(took, n * 8 / 80e6)


def test_wall_clock_pacing_async_on_a_trace() -> None:
    tr, start, n = synthetic("5g").scaled(0.1), 30.0, 3_000_000
    expected = tr.time_to_send(n - BUCKET_BYTES, start)
    shaper = TraceShaper(tr, start)

    async def go() -> float:
        t = time.monotonic()
        async for _ in shaper.asend_chunks(bytes(n)):
            pass
        return time.monotonic() - t

    assert_paced(asyncio.run(go()), expected)


def test_rate_spec_parse_and_errors() -> None:
    s = RateSpec.parse("5g;start=12;scale=0.5")
    assert s == RateSpec("5g", 12.0, 0.5) and RateSpec.parse(s.header()) == s
    assert RateSpec.parse("fixed:100") == RateSpec("fixed:100")
    assert RateSpec.from_json({"trace": "wifi", "start": 3}) == RateSpec("wifi", 3.0)
    assert s.shifted(2.5).start == 14.5
    for bad in ("5g;start=-1", "5g;scale=0", "5g;speed=2", "5g;start=abc", ";start=1"):
        with pytest.raises(TraceError):
            RateSpec.parse(bad)
    for bad_json in ({"start": 1}, {"trace": "5g", "bogus": 1}, {"trace": "5g", "scale": "x"}, [1]):
        with pytest.raises(TraceError):
            RateSpec.from_json(bad_json)
