"""A calibration whose local-generation runs are too far apart is measured again and, if still wide, used by
that run only, never stored as the machine's; every profile records the load it was measured under (#32 item 4).

The machine's noise is what is replaced here (``measure_compute`` returns chosen run times); the store's rule
and its file are the real ones."""

from __future__ import annotations

import json

import pytest

from sakura.catalog import load_catalog
from sakura.model import seeded_model
from sakura.runtime import calibration as cal
from sakura.runtime.compute import ComputeProfile

SHARDS = [(0, 0, 2)]


@pytest.fixture(scope="module")
def model():
    return seeded_model("sakura-tiny")


def timings(monkeypatch, *runs: list[float]) -> list[int]:
    """Let successive measurements give these local-generation samples; returns the call counter."""
    calls = [0]

    def measure(*args, **kw) -> ComputeProfile:
        samples = runs[min(calls[0], len(runs) - 1)]
        calls[0] += 1
        return ComputeProfile(list(SHARDS), [0.01], 0.001, sorted(samples)[len(samples) // 2], list(samples))

    monkeypatch.setattr(cal, "measure_compute", measure)
    monkeypatch.setattr(cal, "zero_cache", lambda *a: None)
    monkeypatch.setattr(cal, "load_per_core", lambda: 0.2)  # a quiet machine (the next test loads it)
    return calls


def test_a_calibration_measured_under_load_is_reused_only_while_the_machine_is_busy(tmp_path, monkeypatch, model):
    calls = timings(monkeypatch, [3.60, 3.62, 3.65])  # a steady load: a tight spread, every run slow
    monkeypatch.setattr(cal, "load_per_core", lambda: 2.5)
    tpl = load_catalog().get("fs-astronaut")
    store = cal.CalibrationStore(tmp_path / "c.json", full_repeats=3)
    store.measure(model, tpl, SHARDS)
    assert store.get(model, tpl, SHARDS).local_full_s == 3.62  # the run that measured it keeps it …
    assert store.busy_load(model, tpl) == 2.5
    (entry,) = json.loads((tmp_path / "c.json").read_text())["machines"].popitem()[1]["profiles"].values()
    assert entry["busy"] and entry["load_per_core"] == 2.5  # … stored flagged
    assert cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS).local_full_s == 3.62  # still busy
    monkeypatch.setattr(cal, "load_per_core", lambda: 0.3)
    later = cal.CalibrationStore(tmp_path / "c.json", full_repeats=3)
    assert later.get(model, tpl, SHARDS) is None  # quiet now: measure again …
    later.measure(model, tpl, SHARDS)
    assert calls[0] == 2 and later.busy_load(model, tpl) is None  # … and the quiet profile replaces it


def test_a_tight_calibration_is_stored_with_its_load(tmp_path, monkeypatch, model):
    calls = timings(monkeypatch, [1.00, 1.02, 1.05])
    tpl = load_catalog().get("fs-astronaut")
    store = cal.CalibrationStore(tmp_path / "c.json", full_repeats=3)
    store.measure(model, tpl, SHARDS)
    assert calls[0] == 1
    (section,) = json.loads((tmp_path / "c.json").read_text())["machines"].values()
    saved = section["profiles"]
    (entry,) = saved.values()
    assert entry["local_full_samples"] == [1.00, 1.02, 1.05] and "refused" not in entry
    assert entry["load_per_core"] is not None and isinstance(entry["busy"], bool)
    assert cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS).local_full_s == 1.02


def test_a_wide_calibration_is_measured_again_then_used_once_and_not_stored(tmp_path, monkeypatch, model):
    calls = timings(monkeypatch, [1.0, 1.6, 3.4], [1.1, 2.0, 2.9])
    tpl = load_catalog().get("fs-astronaut")
    store = cal.CalibrationStore(tmp_path / "c.json", full_repeats=3)
    compute = store.measure(model, tpl, SHARDS)
    assert calls[0] == 2 and compute.local_full_s == 2.0
    assert store.get(model, tpl, SHARDS).local_full_s == 2.0  # this run uses it …
    assert not (tmp_path / "c.json").exists()  # … but the machine's file never gets it
    assert cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS) is None
    (why,) = store.refused.values()
    assert "bound" in why and "not stored" in why
    (row,) = store.summary()["templates"].values()
    assert row["refused"] == why and row["local_full_spread"] > cal.SPREAD_BOUND


def test_a_second_measurement_inside_the_bound_is_stored(tmp_path, monkeypatch, model):
    calls = timings(monkeypatch, [1.0, 1.6, 3.4], [1.00, 1.01, 1.03])
    tpl = load_catalog().get("fs-astronaut")
    store = cal.CalibrationStore(tmp_path / "c.json", full_repeats=3)
    assert store.measure(model, tpl, SHARDS).local_full_s == 1.01 and calls[0] == 2
    assert not store.refused and cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS) is not None


def test_one_local_run_is_not_judged(tmp_path, monkeypatch, model):
    calls = timings(monkeypatch, [1.3])  # the agent and `edit --stream` measure local generation once
    tpl = load_catalog().get("fs-astronaut")
    store = cal.CalibrationStore(tmp_path / "c.json")
    store.measure(model, tpl, SHARDS)
    assert calls[0] == 1 and not store.refused and (tmp_path / "c.json").exists()


def test_two_thread_settings_keep_their_own_sections_of_one_file(tmp_path, monkeypatch, model):
    """The bench (1 torch thread) and the demo's agent (the machine's threads) share the bench's file: each
    keeps its own section, neither measures the other's away."""
    timings(monkeypatch, [1.00, 1.02, 1.05])
    tpl = load_catalog().get("fs-astronaut")
    settings = [{**cal.machine_fingerprint(), "threads": n} for n in (1, 2)]
    for machine in settings:
        monkeypatch.setattr(cal, "machine_fingerprint", lambda m=machine: m)
        cal.CalibrationStore(tmp_path / "c.json", full_repeats=3).measure(model, tpl, SHARDS)
    assert len(json.loads((tmp_path / "c.json").read_text())["machines"]) == 2
    for machine in settings:
        monkeypatch.setattr(cal, "machine_fingerprint", lambda m=machine: m)
        assert cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS) is not None
    monkeypatch.setattr(cal, "machine_fingerprint", lambda: {**settings[0], "threads": 3})
    assert cal.CalibrationStore(tmp_path / "c.json").get(model, tpl, SHARDS) is None
