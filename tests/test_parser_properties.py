"""Property tests (hypothesis) for what clients and users hand the system as text or JSON (issue #30 item 3):
trace specs and trace files, and device jobs. Each input gives a valid result or the parser's own one-line
error, never another exception. (Range headers: tests/test_hostile_rates.py.) 500 cases each; ``make fuzz``
runs 10 000 (profiles in conftest.py)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from device_bridge.errors import EditRejected
from device_bridge.protocol import parse_job
from sakura.catalog import load_catalog
from sakura.net.shaping import RateSpec
from sakura.net.traces import Trace, TraceError, load_trace, parse_trace_text

numbers = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["1e308", "-0", "0", ".5", "1e-300", "nan", "inf", "", "1,5", "9" * 400]))


def one_line(e: Exception) -> bool:
    return "\n" not in str(e) and len(str(e)) < 400


@given(st.lists(st.tuples(numbers, numbers), max_size=8), st.sampled_from(["time_s,mbps\n", "", "# c\n", "t,r\n"]),
       st.sampled_from([",", " ", "\t", ";"]))
def test_trace_files_are_traces_or_trace_errors(rows, header, sep) -> None:
    text = header + "".join(f"{a}{sep}{b}\n" for a, b in rows)
    try:
        trace = parse_trace_text(text, "fuzz")
    except TraceError as e:
        assert one_line(e)
        return
    assert isinstance(trace, Trace) and trace.duration > 0 and np.all(trace.mbps >= 0)
    assert math.isfinite(trace.total_bytes) and math.isfinite(trace.time_to_send(1000, 0.0)) or trace.total_bytes == 0


@given(st.text(max_size=200))
def test_any_text_as_a_trace_file(text) -> None:
    try:
        parse_trace_text(text, "fuzz")
    except TraceError as e:
        assert one_line(e)


names = st.one_of(st.sampled_from(["5g", "4g5g", "wifi", "lte", "nope", "", "fixed:"]), numbers.map("fixed:{}".format),
                  st.text(max_size=30))


@given(names, st.lists(st.tuples(st.sampled_from(["start", "scale", "x", ""]), numbers), max_size=3))
def test_rate_specs_are_specs_or_trace_errors(name, opts) -> None:
    text = ";".join([name] + [f"{k}={v}" for k, v in opts])
    try:
        spec = RateSpec.parse(text)
        trace = spec.load()
    except TraceError as e:
        assert one_line(e)
        return
    assert math.isfinite(spec.start) and spec.scale > 0 and math.isfinite(trace.total_bytes)


CATALOG = load_catalog()
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                           max_leaves=8)
network = st.one_of(json_values, st.fixed_dictionaries({}, optional={
    "trace": st.one_of(names, json_values), "start": st.one_of(st.floats(), json_values),
    "scale": st.one_of(st.floats(), json_values), "regime": st.sampled_from(["paper", "none", "x", None]),
    "trace_csv": st.one_of(st.text(max_size=60), json_values)}))
jobs = st.fixed_dictionaries({}, optional={
    "template_id": st.one_of(st.sampled_from(["fs-astronaut", "mb-coffee", "nope", " "]), json_values),
    "system": st.one_of(st.sampled_from(["sakura", "intq", "fp16", "local", "oracle", "bogus"]), json_values),
    "prompt": st.one_of(st.text(max_size=40), json_values), "catalog_request": json_values,
    "reference_png_b64": st.one_of(st.text(max_size=40), json_values), "photo": json_values,
    "network": network, "reference_output": json_values, "prefetch": json_values})


@given(st.one_of(jobs, json_values))
def test_device_jobs_are_jobs_or_one_line_rejections(job) -> None:
    try:
        parsed, template = parse_job(job, CATALOG)
    except EditRejected as e:
        assert one_line(e)
        return
    assert parsed.template_id == template.id and (parsed.prompt or parsed.photo or parsed.catalog_request is not None)


def test_the_fixed_floor_and_ceiling_are_spelled_in_the_errors() -> None:
    for spec in ("fixed:1e308", "fixed:0"):
        try:
            load_trace(spec)
        except TraceError as e:
            assert one_line(e)
        else:
            raise AssertionError(spec)
