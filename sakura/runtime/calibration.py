"""Device calibration: measured compute per (model, template), kept across edits and restarts.

A device measures its own shard times once per template, before it holds any cache (compute does
not depend on K/V values: it runs on a cache of zeros), on the template's own calibration request —
never on a user's input, so the stored profile is template data plus timings and nothing else.
Every caller (agent, CLI, bench) calibrates the same way, so the same device makes the same choices.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np

from sakura.editing import edit_request
from sakura.model import DiTAdapter, EditRequest
from sakura.runtime.compute import ComputeProfile, measure_compute, zero_cache

log = logging.getLogger(__name__)


def calibration_request(template, model: DiTAdapter) -> EditRequest:
    """A request with the template's geometry and neutral conditioning (its first profiling request,
    a grey reference when that has none): what compute is measured on."""
    first = template.profile_requests[0] if template.profile_requests else None
    req = edit_request(template, first, prompt="a photo", resolution=model.codec.resolution,
                       ref_size=model.codec.ref_size)
    if req.task in ("fs", "vton") and req.reference is None:
        req.reference = np.full((model.codec.ref_size, model.codec.ref_size, 3), 0.5, np.float32)
    return req


class CalibrationStore:
    """Compute profiles by ``model_id/template_id``, in memory and (optionally) in a JSON file."""

    def __init__(self, path: str | Path | None = None, repeats: int = 1) -> None:
        self.path = Path(path) if path else None
        self.repeats = max(1, int(repeats))
        self._lock = threading.Lock()
        self._profiles: dict[str, dict] = {}
        if self.path is not None and self.path.is_file():
            try:
                self._profiles = dict(json.loads(self.path.read_text()))
            except (OSError, ValueError):
                log.warning("ignoring unreadable calibration file %s", self.path)

    def get(self, model: DiTAdapter, template, shards) -> ComputeProfile | None:
        d = self._profiles.get(f"{model.model_id}/{template.id}")
        if not isinstance(d, dict):
            return None
        try:
            prof = ComputeProfile([tuple(s) for s in d["shards"]], [float(x) for x in d["shard_s"]],
                                  float(d["prelude_s"]), float(d["local_full_s"]))
        except (KeyError, TypeError, ValueError):
            return None
        return prof if prof.shards == [tuple(s) for s in shards] else None

    def measure(self, model: DiTAdapter, template, shards) -> ComputeProfile:
        """Measure (``repeats`` runs after a warm-up), keep and return the template's compute profile."""
        req = calibration_request(template, model)
        shard_size = shards[0][2] - shards[0][1]
        compute = measure_compute(model, req, zero_cache(model, req), shard_size, repeats=self.repeats)
        if compute.shards != [tuple(s) for s in shards]:
            raise ValueError(f"{template.id}: the stored files' shard plan does not match this model")
        with self._lock:
            self._profiles[f"{model.model_id}/{template.id}"] = compute.to_dict()
            self._save()
        return compute

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._profiles, indent=1))
            tmp.replace(self.path)
        except OSError as e:
            log.warning("cannot save calibration to %s: %s", self.path, e)
