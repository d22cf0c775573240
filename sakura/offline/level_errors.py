"""Measured per-level errors of the formats whose stored ``Level.error`` is only an ordering.

IntQ's levels carry ``2^-bits`` and CacheGen's ``levels − level``: enough for a policy that compares levels
of one unit, not for adding errors over units or setting one format's quality against another's (the
clairvoyant planner, :mod:`sakura.eval.optimal`). This module measures every level of every fetch unit in
the SAKURA pack's metric (:data:`sakura.offline.tradeoff.QUALITY_METRIC`: importance-weighted squared
error over the centred energy, mean over the unit's K and V of its layers) from the decoded bytes against
the FP16 cache. The builder writes it beside the pack as ``<file id>.errors.json``; a pack built before
has it measured on first use by the bench (and written there when the folder is writable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from sakura.formats import FetchUnit, Level, Range, StreamEncoding
from sakura.offline.lowrank import normalized_importance

Read = Callable[[list[Range]], list[bytes]]
Reference = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, layer) -> FP16 (K, V)
MEASURED = ("intq", "cachegen")  # formats whose stored errors are an ordering only


def unit_error(x_hat: torch.Tensor, x: torch.Tensor, importance: torch.Tensor | None) -> float:
    """The pack's metric for one cache unit: Σ s_j‖x̂_j − x_j‖² / Σ s_j‖x_j − x̄‖²."""
    xd, xh = x.double(), x_hat.double()
    w = normalized_importance(importance, xd.shape[0])[:, None]
    denom = float((w * (xd - xd.mean(0)) ** 2).sum())
    return float((w * (xh - xd) ** 2).sum()) / max(denom, 1e-30)


def measure_level_errors(encoding: StreamEncoding, read: Read, reference: Reference,
                         importance: dict | None = None,
                         progress: Callable[[int, int], None] | None = None) -> dict[int, dict[str, float]]:
    """Per fetch unit index, per level label: the level's measured error. Each level is decoded on its own
    (a fresh encoding: side data such as CacheGen's tables is read with it)."""
    out: dict[int, dict[str, float]] = {}
    units = encoding.units
    for i, unit in enumerate(units):
        out[unit.index] = {lv.label: _level_error(encoding, unit, lv, read, reference, importance or {})
                           for lv in unit.levels}
        if progress:
            progress(i + 1, len(units))
    return out


def _level_error(encoding: StreamEncoding, unit: FetchUnit, level: Level, read: Read, reference: Reference,
                 importance: dict) -> float:
    enc = encoding.fresh()
    priced = enc.priced(unit)
    lv = next(x for x in priced.levels if x.label == level.label)
    ranges = enc.ranges(priced, lv)
    kv = enc.decode(priced, lv, read(ranges))
    errs = []
    for (step, layer), (k, v) in kv.items():
        k_ref, v_ref = reference(step, layer)
        s = importance.get((step, layer))
        errs += [unit_error(k, k_ref, s), unit_error(v, v_ref, s)]
    return round(sum(errs) / len(errs), 6) if errs else float("nan")


def errors_path(packs: str | Path, file_id: str) -> Path:
    return Path(packs) / f"{file_id}.errors.json"


def write_level_errors(packs: str | Path, file_id: str, errors: dict[int, dict[str, float]]) -> Path:
    path = errors_path(packs, file_id)
    path.write_text(json.dumps({"metric": "sakura.offline.tradeoff.QUALITY_METRIC",
                                "units": {str(k): v for k, v in errors.items()}}, indent=1))
    return path


def load_level_errors(packs: str | Path, file_id: str) -> dict[int, dict[str, float]] | None:
    path = errors_path(packs, file_id)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {int(k): v for k, v in raw["units"].items()}


def file_reader(path: str | Path) -> Read:
    """Reads ranges ``(offset, length)`` of a stored file."""
    def read(ranges: list[Range]) -> list[bytes]:
        with open(path, "rb") as f:
            out = []
            for offset, n in ranges:
                f.seek(offset)
                out.append(f.read(n))
            return out
    return read
