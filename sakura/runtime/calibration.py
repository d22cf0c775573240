"""Device calibration: measured compute per (model, template), the link's request round trip and the rebuild
rate per stored file, kept across edits and restarts, valid for one machine and one set of model weights.

A device measures its own shard times once per template, before it holds any cache (compute does
not depend on K/V values: it runs on a cache of zeros), on the template's own calibration request —
never on a user's input, so the stored profile is template data plus timings and nothing else.
Every caller (agent, CLI, bench) calibrates the same way, so the same device makes the same choices.

The regime scale of every benchmark rests on the local-generation time, so it is measured with
repeats, its spread is kept, and it is reused by every later run until the machine (CPU, core count,
torch version and threads) or the model's weights change. The request round trip (request sent →
first byte) is what real-clock transfers measured; the simulated clock charges it per request.

The rebuild rate (seconds per unit of ``Level.work``) is timed once per stored file and reconstructor, on a sample of
its levels: the device's first plan of an edit prices rebuilds with it, before the edit has timed any of its own
(priced free, a plan made at the start put a 3.4×-work rung on time and later found it 8 ms late, issue #32).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sakura.editing import edit_request
from sakura.formats import FetchUnit, Level, StreamEncoding
from sakura.model import DiTAdapter, EditRequest
from sakura.places import cache_root
from sakura.runtime.compute import (
    SPREAD_BOUND,
    ComputeProfile,
    measure_compute,
    measure_executor_compute,
    spread,
    zero_cache,
)

log = logging.getLogger(__name__)

VERSION = 3  # 3: one section per machine fingerprint (the bench's 1 thread and the agent's own share a file)
KEEP_ROUND_TRIPS = 400  # most recent request round trips kept
# Local-generation runs further apart than SPREAD_BOUND are re-measured once; still that wide, the profile
# serves the run that measured it and is never stored as the machine's (a busy machine calibrated fs-astronaut
# at 3.4 s with runs 85 % apart, and every later run reused it).
# 1-minute load average per core above which a measurement is flagged busy. A busy profile is stored flagged and
# reused only while the machine is busy: the first quiet run measures again (a steady load passes the spread rule:
# local generation measured 3.6 s, spread 2 %, beside two busy loops per core, against 1.3 s quiet).
BUSY_LOAD_PER_CORE = 1.0
REBUILD_SAMPLE_UNITS = 4  # units timed per stored file for its rebuild rate
REBUILD_SAMPLE_LEVELS = 6  # levels timed per such unit, spread over its ladder


def load_per_core() -> float | None:
    """The 1-minute load average per core now (None where the OS does not say)."""
    try:
        return round(os.getloadavg()[0] / (os.cpu_count() or 1), 2)
    except OSError:
        return None


def default_path() -> Path:
    """Where `sakura bench` keeps its calibration between runs (``SAKURA_CACHE_DIR`` or the XDG cache)."""
    return cache_root() / "calibration.json"


def machine_fingerprint() -> dict:
    """What makes compute times comparable: the CPU, how many cores, the torch build and its threads."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()}


def model_fingerprint(model: DiTAdapter) -> str:
    """``model_id`` plus a digest of the weights (computed once per model object): retrained weights
    under the same name are a different model."""
    cached = getattr(model, "_sakura_fingerprint", None)
    if cached:
        return cached
    h = hashlib.sha1()
    for name, t in sorted(model.transformer.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().to(torch.float32).contiguous().numpy().tobytes()[:4096])  # a prefix per tensor
        h.update(str(float(t.float().sum())).encode())
    model._sakura_fingerprint = f"{model.model_id}@{h.hexdigest()[:12]}"
    return model._sakura_fingerprint


def calibration_request(template, model: DiTAdapter) -> EditRequest:
    """A request with the template's geometry and neutral conditioning (its first profiling request,
    a grey reference when that has none): what compute is measured on."""
    first = template.profile_requests[0] if template.profile_requests else None
    req = edit_request(template, first, prompt="a photo", resolution=model.codec.resolution,
                       ref_size=model.codec.ref_size)
    if req.task in ("fs", "vton") and req.reference is None:
        req.reference = np.full((model.codec.ref_size, model.codec.ref_size, 3), 0.5, np.float32)
    return req


@dataclass(frozen=True)
class TimedDecode:
    unit: FetchUnit
    level: Level  # as stored (its work and bytes without a first use's side data)
    seconds: float


def time_decodes(encoding: StreamEncoding, read: Callable, timer: Callable[[], float] = time.thread_time,
                 levels_per_unit: int | None = REBUILD_SAMPLE_LEVELS) -> list[TimedDecode]:
    """Decode a sample of a stored file's levels (``REBUILD_SAMPLE_UNITS`` units spread over the stream, each at
    ``levels_per_unit`` levels spread over its ladder; None: every level) as a first use would, and time each.
    ``read(ranges)`` returns a level's bytes."""
    units = encoding.units
    picks = sorted(set(np.linspace(0, len(units) - 1, min(REBUILD_SAMPLE_UNITS, len(units))).round().astype(int)))
    timed = []
    for i in picks:
        unit = units[i]
        count = len(unit.levels) if levels_per_unit is None else min(levels_per_unit, len(unit.levels))
        for k in sorted(set(np.linspace(0, len(unit.levels) - 1, count).round().astype(int))):
            enc = encoding.fresh()
            priced = enc.priced(unit)
            blobs = read(enc.ranges(priced, priced.levels[k]))
            t0 = timer()
            enc.decode(priced, priced.levels[k], blobs)
            timed.append(TimedDecode(unit, unit.levels[k], timer() - t0))
    return timed


def fit_affine(x, y) -> tuple[float, float]:
    """Least-squares ``y ≈ a + b·x`` with both ≥ 0: (a, b) (the optimum's rebuild fit)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(set(x.tolist())) < 2:
        return float(y.mean()), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(y.mean()), 0.0
    if a < 0:
        return 0.0, float((x @ y) / (x @ x))
    return float(a), float(b)


def measure_rebuild_rate(encoding: StreamEncoding, read: Callable) -> float | None:
    """Seconds per unit of rebuild work over a timed sample of the file's levels (proportional, as the device's
    :class:`~sakura.online.monitor.RebuildRate` learns it); None for a file whose levels model no work."""
    if not any(lv.work > 0 for u in encoding.units for lv in u.levels):
        return None
    timed = [d for d in time_decodes(encoding, read) if d.level.work > 0]
    return sum(d.seconds for d in timed) / sum(d.level.work for d in timed)


class CalibrationStore:
    """Compute profiles by ``model fingerprint/template_id`` and the link's round trips, in memory and
    (optionally) in a JSON file. ``repeats`` masked runs and ``full_repeats`` local runs per template."""

    def __init__(self, path: str | Path | None = None, repeats: int = 1, full_repeats: int | None = None) -> None:
        self.path = Path(path) if path else None
        self.repeats = max(1, int(repeats))
        self.full_repeats = full_repeats
        self.machine = machine_fingerprint()
        self._lock = threading.Lock()
        self._profiles: dict[str, dict] = {}
        self._refused: dict[str, dict] = {}  # measured too widely spread: this process only, never saved
        self._measured_here: set[str] = set()  # keys this process measured (kept for its whole run)
        self._round_trips: list[float] = []
        self._link_measured_at = ""
        self._rebuild: dict[str, dict] = {}  # "file id@reconstructor" -> {s_per_work, measured_at, load_per_core}
        self.loaded_from: str | None = None  # the file the profiles came from, when they did
        if self.path is not None and self.path.is_file():
            self._load()

    @property
    def machine_key(self) -> str:
        """The key this machine's section is filed under in the calibration file."""
        return hashlib.sha1(json.dumps(self.machine, sort_keys=True).encode()).hexdigest()[:12]

    def _read(self) -> dict:
        """The file's sections by machine ({} for a missing, unreadable or older file)."""
        try:
            d = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("ignoring unreadable calibration file %s", self.path)
            return {}
        if not isinstance(d, dict) or d.get("version") != VERSION or not isinstance(d.get("machines"), dict):
            log.info("calibration file %s is of another version: measuring again", self.path)
            return {}
        return d["machines"]

    def _load(self) -> None:
        d = self._read().get(self.machine_key)
        if not isinstance(d, dict) or d.get("machine") != self.machine:
            log.info("calibration file %s has nothing for this machine and setting: measuring", self.path)
            return
        self._profiles = {k: v for k, v in dict(d.get("profiles", {})).items() if isinstance(v, dict)}
        link = d.get("link") or {}
        self._round_trips = [float(x) for x in link.get("round_trips_s", [])][-KEEP_ROUND_TRIPS:]
        self._link_measured_at = str(link.get("measured_at", ""))
        self._rebuild = {k: v for k, v in dict(d.get("rebuild", {})).items()
                         if isinstance(v, dict) and isinstance(v.get("s_per_work"), (int, float))}
        self.loaded_from = str(self.path)

    @staticmethod
    def _key(model: DiTAdapter, template, stack: str = "") -> str:
        return f"{model_fingerprint(model)}/{template.id}" + (f"@{stack}" if stack else "")

    def get(self, model: DiTAdapter, template, shards, stack: str = "") -> ComputeProfile | None:
        """The stored profile of the eager model, or (``stack``, e.g. ``executorch``) of the shards run
        through that executor."""
        key = self._key(model, template, stack)
        d = self._refused.get(key) or self._profiles.get(key)
        if d is None:
            return None
        if d.get("busy") and key not in self._measured_here and not self.machine_busy():
            log.info("%s: its calibration was measured under load (%s per core) and the machine is quiet now: "
                     "measuring again", template.id, d.get("load_per_core"))
            return None
        try:
            prof = ComputeProfile([tuple(s) for s in d["shards"]], [float(x) for x in d["shard_s"]],
                                  float(d["prelude_s"]), float(d["local_full_s"]),
                                  [float(x) for x in d.get("local_full_samples", [])])
        except (KeyError, TypeError, ValueError):
            return None
        return prof if prof.shards == [tuple(s) for s in shards] else None

    def measure(self, model: DiTAdapter, template, shards) -> ComputeProfile:
        """Measure (``repeats`` runs after a warm-up), keep and return the template's compute profile.
        Local runs wider apart than SPREAD_BOUND are measured once more; if still wide, the profile is
        used by this process only and flagged ``refused`` (judged only with two or more local runs)."""
        req = calibration_request(template, model)
        shard_size = shards[0][2] - shards[0][1]
        for attempt in range(2):
            compute = measure_compute(model, req, zero_cache(model, req), shard_size, repeats=self.repeats,
                                      full_repeats=self.full_repeats)
            width = spread(compute.local_full_samples)
            if width is None or width <= SPREAD_BOUND:
                break
            log.warning("%s: local-generation runs %.0f%% apart (bound %.0f%%)%s", template.id, 100 * width,
                        100 * SPREAD_BOUND, ": measuring again" if attempt == 0 else "")
        if compute.shards != [tuple(s) for s in shards]:
            raise ValueError(f"{template.id}: the stored files' shard plan does not match this model")
        load = load_per_core()
        entry = {**compute.to_dict(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_per_core": load,
                 "busy": load is not None and load > BUSY_LOAD_PER_CORE}
        key = self._key(model, template)
        with self._lock:
            self._measured_here.add(key)
            if width is not None and width > SPREAD_BOUND:
                entry["refused"] = (f"local runs {100 * width:.0f}% apart, above the {100 * SPREAD_BOUND:.0f}% bound: "
                                    "used by this run only, not stored")
                self._refused[key] = entry
            else:
                self._refused.pop(key, None)
                self._profiles[key] = entry
                self._save()
        return compute

    def measure_stack(self, model: DiTAdapter, template, executor, stack: str, base: ComputeProfile) -> ComputeProfile:
        """The template's shard times through ``executor`` (named ``stack``), on ``base``'s calibration
        request; kept (and stored) the way ``base`` was: a refused base's stack profile is not stored."""
        req = calibration_request(template, model)
        compute = measure_executor_compute(executor, req, zero_cache(model, req), base, repeats=self.repeats)
        entry = {**compute.to_dict(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                 "load_per_core": load_per_core(), "stack": stack}
        key, refused = self._key(model, template, stack), self._key(model, template) in self._refused
        with self._lock:
            if refused:
                self._refused[key] = {**entry, "refused": "its eager calibration was refused"}
            else:
                self._profiles[key] = entry
                self._save()
        return compute

    @staticmethod
    def machine_busy() -> bool:
        load = load_per_core()
        return load is not None and load > BUSY_LOAD_PER_CORE

    def busy_load(self, model: DiTAdapter, template) -> float | None:
        """The load per core the template's profile was measured under, when that was busy (None: quiet)."""
        d = self._refused.get(self._key(model, template)) or self._profiles.get(self._key(model, template)) or {}
        return d.get("load_per_core") if d.get("busy") else None

    @property
    def refused(self) -> dict[str, str]:
        """Templates (by ``fingerprint/template``) whose profile this process measured but did not store, and why."""
        return {k: v["refused"] for k, v in self._refused.items()}

    # -- the link --------------------------------------------------------------------------------------
    def record_round_trips(self, samples: list[float]) -> None:
        """Round trips (request sent → first byte) that real transfers measured."""
        if not samples:
            return
        with self._lock:
            self._round_trips = (self._round_trips + [float(x) for x in samples])[-KEEP_ROUND_TRIPS:]
            self._link_measured_at = time.strftime("%Y-%m-%dT%H:%M:%S")
            self._save()

    @property
    def request_overhead_s(self) -> float | None:
        """Median measured round trip; None until a real transfer measured one."""
        return statistics.median(self._round_trips) if self._round_trips else None

    # -- rebuilds ----------------------------------------------------------------------------------------
    def rebuild_rate(self, key: str) -> float | None:
        """The stored rebuild rate (seconds per unit of work) of ``key`` ("file id@reconstructor"), if measured."""
        d = self._rebuild.get(key)
        return float(d["s_per_work"]) if d is not None else None

    def record_rebuild_rate(self, key: str, s_per_work: float) -> None:
        with self._lock:
            self._rebuild[key] = {"s_per_work": float(s_per_work), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                  "load_per_core": load_per_core()}
            self._save()

    def summary(self) -> dict:
        """What a benchmark used: where from, the machine, each template's local time and its spread,
        the request overhead."""
        rt = self._round_trips
        return {
            "file": str(self.path) if self.path else None,
            "reused_from_file": self.loaded_from is not None,
            "machine": self.machine,
            "templates": {
                k: {
                    "local_full_s": v["local_full_s"],
                    "runs": len(v.get("local_full_samples", [])),
                    "local_full_spread": spread(v.get("local_full_samples", [])),
                    "measured_at": v.get("measured_at", ""),
                    "load_per_core": v.get("load_per_core"),
                    "busy": v.get("busy"),
                    **({"refused": v["refused"]} if "refused" in v else {}),
                }
                for k, v in sorted((self._profiles | self._refused).items())
            },
            "request_overhead_s": self.request_overhead_s,
            "round_trips": len(rt),
            "request_overhead_p10_p90_s": [float(np.percentile(rt, 10)), float(np.percentile(rt, 90))] if rt else None,
            "link_measured_at": self._link_measured_at,
            "rebuild_s_per_work": {k: v["s_per_work"] for k, v in sorted(self._rebuild.items())},
        }

    def _save(self) -> None:
        if self.path is None:
            return
        machines = self._read()  # other machines' (or thread settings') sections stay as they are
        machines[self.machine_key] = {
            "machine": self.machine, "profiles": self._profiles,
            "link": {"round_trips_s": self._round_trips, "measured_at": self._link_measured_at},
            "rebuild": self._rebuild}
        data = {"version": VERSION, "machines": machines}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self.path)
        except OSError as e:
            log.warning("cannot save calibration to %s: %s", self.path, e)

