"""Hostile numbers at the link (issue #30 D1–D4): huge Range positions, rates past any link or below the
client floor, a trace whose median is 0. Each is a clear 400/416, a valid result or a one-line error."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.sync.client import connect

from sakura.net.clock import SimClock
from sakura.net.shaping import (
    DEADLINE_FACTOR,
    DEADLINE_SLACK_S,
    MIN_CLIENT_MBPS,
    DeadlinePassed,
    RateSpec,
    TraceShaper,
    check_client_trace,
)
from sakura.net.traces import MAX_MBPS, Trace, TraceError, load_trace, paper_regime_scale
from sakura.server import RunningServer, start_server
from sakura.server.ranges import BadRange, RangeNotSatisfiable, parse_range
from sakura.server.streaming import paced

SIZE = 100_000
HUGE = "9" * 4400  # past Python's int-string limit (4300 digits)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    d = tmp_path_factory.mktemp("rates") / "packs"
    d.mkdir()
    (d / "tpl.pack").write_bytes(np.random.default_rng(1).bytes(SIZE))
    with start_server(d) as s:
        yield s


# ------------------------------------------------------------------------------ D1: Range numbers
def test_range_positions_of_thousands_of_digits_are_numbers_not_errors(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        cases = {f"bytes=0-{HUGE}": (206, f"bytes 0-{SIZE - 1}/{SIZE}"),  # to the end of the file
                 f"bytes=-{HUGE}": (206, f"bytes 0-{SIZE - 1}/{SIZE}"),  # a suffix longer than the file
                 f"bytes={HUGE}-": (416, None),  # starts past the end
                 f"bytes={HUGE}-5": (400, None)}  # ends before it starts
        for value, (status, content_range) in cases.items():
            r = http.get("/packs/tpl", headers={"Range": value})
            assert r.status_code == status, (value[:20], r.status_code, r.text[:200])
            if content_range:
                assert r.headers["content-range"] == content_range and len(r.content) == SIZE
        assert http.get("/healthz").status_code == 200


positions = st.one_of(st.integers(0, 3 * SIZE).map(str), st.integers(0, 5000).map(lambda n: "9" * n), st.just(""))


@given(st.lists(st.tuples(positions, positions, st.sampled_from(["", " ", "0"])), min_size=1, max_size=6),
       st.integers(0, 10**6))
def test_parse_range_gives_ranges_inside_the_file_or_a_range_error(specs, size) -> None:
    value = "bytes=" + ",".join(f"{pad}{a}-{b}" for a, b, pad in specs)
    try:
        ranges = parse_range(value, size)
    except (BadRange, RangeNotSatisfiable):
        return
    assert ranges and all(0 <= a <= b < size for a, b in ranges)


@given(st.text(max_size=60))
def test_parse_range_never_raises_anything_else_on_any_text(value) -> None:
    try:
        out = parse_range(value, 1000)
    except (BadRange, RangeNotSatisfiable):
        return
    assert out is None or all(0 <= a <= b < 1000 for a, b in out)


# ------------------------------------------------------------------------------ D2 / D3: rates
@pytest.mark.parametrize("spec", ["fixed:1e308", "5g;scale=1e300", "fixed:1e-300", "5g;scale=1e-300",
                                  f"fixed:{MIN_CLIENT_MBPS / 2}"])
def test_rates_past_any_link_or_below_the_floor_are_refused_over_http_and_websocket(server, spec) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.get("/packs/tpl", headers={"Range": "bytes=0-9999", "X-Sakura-Trace": spec})
        assert r.status_code == 400 and "X-Sakura-Trace" in r.json()["error"], (spec, r.status_code, r.text)
    rate = RateSpec.parse(spec).to_json()
    with connect(f"{server.url.replace('http', 'ws')}/ws/tpl", compression=None, max_size=None) as ws:
        ws.send(json.dumps({"id": 1, "ranges": [[0, 10_000]], "rate": rate}))
        reply = json.loads(ws.recv(timeout=30))
        assert reply["status"] == 400 and "rate" in reply["error"], reply
        ws.send(json.dumps({"id": 2, "ranges": [[0, 4]]}))  # the connection stays usable
        assert json.loads(ws.recv(timeout=30)) == {"id": 2, "nbytes": 4}


def test_the_floor_is_on_the_average_so_zero_samples_stay_bandwidth() -> None:
    outage = Trace.from_samples(np.arange(10.0), np.array([0.0] * 6 + [200.0] * 4), "outage")
    assert check_client_trace(outage) is outage  # 0 Mbps 60 % of the time, 80 Mbps on average: accepted
    dead = Trace.from_samples(np.arange(3.0), np.zeros(3), "dead")
    with pytest.raises(TraceError, match="floor"):
        check_client_trace(dead)
    check_client_trace(load_trace(f"fixed:{MIN_CLIENT_MBPS}"))  # the floor itself is a link
    with pytest.raises(TraceError, match="at most"):
        load_trace(f"fixed:{MAX_MBPS * 10}")
    with pytest.raises(TraceError, match="at most"):
        load_trace("wifi", 1e300)


def test_every_paced_response_has_a_deadline_from_its_bytes_and_rate() -> None:
    clock = SimClock()
    floor = load_trace(f"fixed:{MIN_CLIENT_MBPS}")
    shaper = TraceShaper(floor, 0.0, clock)
    need = floor.time_to_send(50_000, 0.0)
    assert shaper.deadline(50_000) == pytest.approx(DEADLINE_SLACK_S + DEADLINE_FACTOR * need)
    assert math.isfinite(shaper.deadline(10**9))  # the longest legitimate stream at the floor has one too

    async def drain(shaper: TraceShaper, nbytes: int, stall_s: float = 0.0) -> int:
        got = 0
        async for chunk in paced(iter([b"x" * nbytes]), shaper, nbytes):
            got += len(chunk)
            clock.advance(stall_s)  # a reader that takes this long for every chunk
        return got

    assert asyncio.run(drain(TraceShaper(floor, 0.0, clock), 50_000)) == 50_000  # a reader that keeps up
    with pytest.raises(DeadlinePassed):
        asyncio.run(drain(TraceShaper(floor, 0.0, clock), 50_000, stall_s=100.0))


# ------------------------------------------------------------------------------ D4: median 0
def test_a_trace_down_most_of_the_time_scales_from_its_non_zero_samples(tmp_path: Path) -> None:
    down = Trace.from_samples(np.arange(10.0), np.array([0.0] * 6 + [100.0, 200.0, 200.0, 300.0]), "down")
    assert down.median_mbps == 0 and down.typical_mbps == 200.0
    up = Trace.from_samples(np.arange(4.0), np.array([100.0, 200.0, 200.0, 300.0]), "up")
    assert paper_regime_scale(down, 1e6, 1.0) == pytest.approx(paper_regime_scale(up, 1e6, 1.0))
    assert Trace.from_samples(np.arange(3.0), np.zeros(3)).typical_mbps == 0.0
