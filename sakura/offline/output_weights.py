"""What a shard's stored error costs the output: per shard, the edit's masked MSE per unit of the pack's error.

The pack's per-level error (:data:`sakura.offline.tradeoff.QUALITY_METRIC`) is normalised per cache unit, so
it orders one shard's levels but says nothing about which shard matters more: an error in the first denoising
step's K/V is carried through every later step, one in a late step barely shows. Within one shard the output's
masked MSE grows about linearly with the stored error (over three decades of error), while the slope differs
by two to three orders of magnitude between shards (``docs/results/issue32/policy7/``). So per shard j

    w_j = geometric mean over two anchor levels ℓ of  MSE_masked(output with shard j at ℓ, every other exact)
                                                        / error(ℓ)

measured at build on (up to three of) the template's profiling requests (no user data), output against the
exact-cache output, and ``w_j · error`` is the level's predicted share of the edit's masked MSE: errors of
different shards become comparable and their sum predicts the output's MSE. Also measured: the masked MSE of
local generation (no cache) against the same reference, what the local fallback delivers in the same unit.

One number per shard is not the whole story: within a shard the ratio MSE / error moves by up to 10× from one
level to the next, steadily over requests (``docs/results/issue32/policy7/linearity-*.txt``). So every level is
measured the same way (``level_mse``: that shard at the level, on the same profiling requests, mean), and the device
prices each level by its own measured output MSE (:class:`sakura.formats.pack.PackEncoding` rescales its error to
``level_mse / w_j``, on the pack's scale).

The reuse fallback (a shard run on its layers' K/V of one step earlier) is measured the same way (``reuse_mse``: that
shard's layers on the previous step's exact K/V, the rest exact): the pack's ``step_error`` is a K/V distance, and
priced through the shard's weight it came out 4-7x below what a reuse does to the output (300-1200x on mb-sd;
``docs/results/issue32/policy14/``), so the device and the optimum took reuse for cheaper than the levels it replaces.

Stored in the SAKURA pack's header (``build.output_weight``, ``build.local_output_mse``,
``build.level_output_mse``, ``build.reuse_output_mse``): the device reads them with the header it already
fetches. A pack can be published before they are measured (:func:`reserve_output_weights`:
``build.output_weights_pending`` and room for them in the header), and priced in place later: every chunk keeps
its offset, so a device holding the first header reads the same bytes, and reads the header again to get the
prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from sakura.formats import FORMATS, KV, pack
from sakura.formats.base import StreamEncoding
from sakura.formats.container import ContainerFile, header_text, write_container

# The levels measured per shard: the stored errors nearest these (log scale), in the range the runtime uses; and at
# most this many of the profiling requests (the ratio moves 2-5x over three decades of error and over requests,
# the weights three orders of magnitude over shards: docs/results/issue32/policy7/).
ANCHOR_ERRORS = (0.03, 0.003)
MAX_REQUESTS = 3
PENDING = "output_weights_pending"  # build section: published first, priced later (the device re-reads the header)
LONGEST_VALUE = 1.111e-300  # the longest JSON a stored value (4 significant digits, >= 0) can take: room for any
WEIGHT_FLOOR = 1e-12  # a shard whose levels never change the output still gets a (negligible) price
METRIC = ("masked MSE of the output (pixels in [0, 1]) per unit of the pack's error, geometric mean over anchor "
          "levels, mean over (up to 3 of) the template's profiling requests; one shard at the level, the rest exact")
# Every level on all of them, like the anchors: one request got a shard's magnitude wrong where its sensitivity
# moves with the request (docs/results/issue32/policy12/, policy13/)
LEVEL_METRIC = ("per shard, per level (the frontier's order): masked MSE of the output (pixels in [0, 1]), mean over "
                "(up to 3 of) the template's profiling requests; that shard at the level, the rest exact")

REUSE_METRIC = ("per shard (null: no previous step): masked MSE of the output (pixels in [0, 1]) with that shard's "
                "layers on the previous step's exact K/V, the rest exact, mean over (up to 3 of) the template's "
                "profiling requests")


@dataclass(frozen=True)
class OutputWeights:
    weights: tuple[float, ...]  # per shard (fetch unit index)
    local_mse: float  # masked MSE of local generation against the exact-cache output
    level_mse: tuple[tuple[float, ...], ...] = ()  # per shard, per level: the output's masked MSE (() not measured)
    reuse_mse: tuple[float | None, ...] = ()  # per shard: the output's masked MSE of a reuse (None: no previous step)

    def to_build(self) -> dict:
        out = {"output_weight": [float(f"{w:.4g}") for w in self.weights],
               "local_output_mse": float(f"{self.local_mse:.4g}"), "output_weight_metric": METRIC}
        if self.level_mse:
            out |= {"level_output_mse": [[float(f"{m:.4g}") for m in per] for per in self.level_mse],
                    "level_output_mse_metric": LEVEL_METRIC}
        if self.reuse_mse:
            out |= {"reuse_output_mse": [None if m is None else float(f"{m:.4g}") for m in self.reuse_mse],
                    "reuse_output_mse_metric": REUSE_METRIC}
        return out


def masked_mse(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    return float(np.mean((a[mask].astype(np.float64) - b[mask].astype(np.float64)) ** 2))


def anchor_levels(levels, targets=ANCHOR_ERRORS) -> list:
    """The levels (error > 0) whose stored error is nearest each target on a log scale, each once."""
    lossy = [lv for lv in levels if lv.error > 0]
    picked = []
    for t in targets:
        lv = min(lossy, key=lambda lv: abs(math.log(lv.error / t)), default=None)
        if lv is not None and lv not in picked:
            picked.append(lv)
    return picked


def measure_output_weights(model, requests, exact: KV, encoding: StreamEncoding,
                           read: Callable[[list], list[bytes]],
                           progress: Callable[[int, int], None] | None = None,
                           targets: tuple[float, ...] = ANCHOR_ERRORS, per_level: bool = True,
                           max_requests: int = MAX_REQUESTS, reuse: bool = True) -> OutputWeights:
    """Per fetch unit of ``encoding`` (a shard): its weight, from masked runs of ``requests`` with that unit at
    each anchor level and the rest of the cache ``exact``; with ``per_level`` every level's masked MSE the same
    way (an exact level's is 0: it is not run); with ``reuse`` a reuse's, where the unit has a previous step; plus
    local generation's masked MSE. On the first ``max_requests`` of ``requests``."""
    requests = list(requests)[:max_requests]
    # (each run below changes the K/V of one step on: it starts at that step from the exact run's state there)
    trajectories: list[dict] = [{} for _ in requests]
    references = [model.masked_edit(req, lambda s, layer: exact[(s, layer)], trajectory=states).image
                  for req, states in zip(requests, trajectories)]

    units = encoding.units

    def mse_of(kv: dict, changed: dict, progress_at: int) -> list[float]:
        """Per request: the masked MSE of the run whose K/V are ``kv``, which differ from the exact run's at
        ``changed``'s keys only (``progress_at``: the units measured, for the progress report)."""
        step, mse = min(s for s, _ in changed), []
        for req, ref, states in zip(requests, references, trajectories):
            if progress:  # (per run: a caller that holds at a report, e.g. the demo's builds, holds soon)
                progress(progress_at, len(units))
            run = model.masked_edit(req, lambda s, layer: kv[(s, layer)], resume=(step, states[step]))
            mse.append(masked_mse(run.image, ref, req.mask))
        return mse

    measured: dict[tuple[int, str], list[float]] = {}  # per request (an anchor is also in the table: each run once)

    def mse_with(unit, lv) -> float:
        if lv.error == 0:
            return 0.0
        done = measured.get((unit.index, lv.label))
        if done is None:
            enc = encoding.fresh()
            decoded = enc.decode(unit, lv, read(enc.ranges(unit, lv)))
            done = measured[(unit.index, lv.label)] = mse_of({**exact, **decoded}, decoded, unit.index)
        return float(np.mean(done))

    weights, per_level_mse = [], []
    for i, unit in enumerate(units):
        ratios = [mse / lv.error for lv in anchor_levels(unit.levels, targets)
                  if (mse := mse_with(unit, lv)) > 0]
        weights.append(max(WEIGHT_FLOOR, math.exp(np.mean(np.log(ratios)))) if ratios else WEIGHT_FLOOR)
        if per_level:
            per_level_mse.append(tuple(mse_with(unit, lv) for lv in unit.levels))
        if progress:
            progress(i + 1, len(units))

    def reuse_mse(unit) -> float | None:
        if encoding.step_error(unit) is None:  # (step 0: nothing to reuse)
            return None
        step, l0, l1 = encoding.info.shards[unit.index]
        previous = {(step, layer): exact[(step - 1, layer)] for layer in range(l0, l1)}
        return float(np.mean(mse_of({**exact, **previous}, previous, len(units))))

    reused = tuple(reuse_mse(unit) for unit in units) if reuse else ()
    local = float(np.mean([masked_mse(model.full_edit(req).image, ref, req.mask)
                           for req, ref in zip(requests, references)]))
    return OutputWeights(tuple(weights), local, tuple(per_level_mse), reused)


def _header_and_chunks(pack_path: str | Path) -> tuple[dict, list[bytes], int]:
    """The SAKURA pack's header (without its chunk index), its chunks, and its header's JSON length."""
    src = ContainerFile(pack_path, pack.FORMAT, pack.SUPPORTED_VERSIONS)
    header = {k: v for k, v in src.header.items() if k not in ("chunk_lengths", "chunk_crc32", "data_length")}
    chunks = [src.read(*src.index.span(i)) for i in range(len(src.index))]
    length = len(src.header_bytes) - 8
    del src
    return header, chunks, length


def store_output_weights(pack_path: str | Path, measured: OutputWeights) -> None:
    """Rewrite the SAKURA pack's header with ``measured`` in its build section (chunks unchanged, replaced
    atomically; within the header's length where they fit, so every chunk keeps its offset)."""
    header, chunks, length = _header_and_chunks(pack_path)
    stale = ("level_output_mse", "level_output_mse_metric", "reuse_output_mse", "reuse_output_mse_metric", PENDING)
    kept = {k: v for k, v in header.get("build", {}).items() if k not in stale}
    header["build"] = {**kept, **measured.to_build()}  # (no stale per-level table beside new weights)
    write_container(pack_path, header, chunks, room=length)


def reserve_output_weights(pack_path: str | Path) -> None:
    """Mark the SAKURA pack as priced later (``build.output_weights_pending``; any prices it had are dropped) and
    pad its header with room for every shard's weight and every level's output MSE: :func:`store_output_weights`
    then leaves its chunks where they are. Its levels keep the pack's own errors meanwhile."""
    fmt = FORMATS["sakura"]
    units = fmt.encoding_cls(fmt.open(pack_path), level_output_mse=False).units
    longest = OutputWeights((LONGEST_VALUE,) * len(units), LONGEST_VALUE,
                            tuple((LONGEST_VALUE,) * len(u.levels) for u in units), (LONGEST_VALUE,) * len(units))
    header, chunks, _ = _header_and_chunks(pack_path)
    prices = longest.to_build()
    build = {k: v for k, v in header.get("build", {}).items() if k not in prices}  # (none until measured)
    room = len(header_text({**header, "build": {**build, **prices}}, chunks))
    header["build"] = {**build, PENDING: True}
    write_container(pack_path, header, chunks, room=room)
