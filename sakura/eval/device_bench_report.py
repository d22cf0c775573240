"""What ``sakura bench-device``'s measurements mean: per-config level rows, per-shard rows, the summary
(means, rebuild / execute ratios, hidden shares) and the rank at which rebuild reaches the budget.
The measuring is :mod:`sakura.eval.device_bench`."""

from __future__ import annotations

import statistics
from typing import Sequence

REBUILD_BUDGET = 0.1  # issue #18: a shard's rebuild within 10 % of its execute time


def rank_at_budget(ranks: Sequence[float], rebuild_ms: Sequence[float], execute_ms: float,
                   budget: float = REBUILD_BUDGET) -> int | None:
    """The decoded rank at which a shard's rebuild reaches ``budget`` of its execute time, from a least-squares
    line through (level rank, rebuild ms) of the measured configs: rebuild work is ``n · rank · d`` per unit
    plus a part that does not grow with rank (means, dispatch). 0: not even rank 0 fits; None: fewer than
    two distinct ranks, or times that do not grow with rank (nothing to extrapolate from)."""
    import numpy as np

    points = [(r, ms) for r, ms in zip(ranks, rebuild_ms) if r is not None and r == r]  # drop unknown (nan) ranks
    if len({r for r, _ in points}) < 2:
        return None
    slope, intercept = np.polyfit(*zip(*points), 1)
    if slope <= 0:
        return None
    return max(0, int((budget * execute_ms - intercept) / slope + 1e-6))  # + 1e-6: a fit exact but for rounding


def config_key(cfg: tuple[int, int, int]) -> str:  # a v2 pack reads each config's level at its bytes: level_for
    return "r{}-a{}-b{}".format(*cfg)


def hidden_share(rebuild: Sequence[float], execute: Sequence[float]) -> float:
    """Share of total rebuild time overlapped by execution when rebuild of shard p+1 runs during
    execution of shard p (shard 0's rebuild is the pipeline's start-up and is never hidden)."""
    total = sum(rebuild)
    if total <= 0:
        return 1.0
    hidden = sum(min(rebuild[p + 1], execute[p]) for p in range(len(rebuild) - 1))
    return hidden / total


def level_rows(info, cfgs, key, blobs) -> dict:
    """Per config: the level read on each shard (v2: its chunk count ``k``, the rank it decodes to, mean
    planes of A and B per component, bytes; v1: the config itself) and the means over shards."""
    out = {}
    for c in cfgs:
        rows = []
        for s in range(info.num_shards):
            nbytes = sum(map(len, blobs[(s, c)].values()))
            lv = next((f for f in info.frontier(s) if f.key == key[(s, c)]), None) if info.version >= 2 else None
            row = {"key": list(key[(s, c)]), "bytes": nbytes}
            row.update({"r": lv.r, "b_a": lv.b_a, "b_b": lv.b_b} if lv is not None else
                       {"r": c[0], "b_a": c[1], "b_b": c[2]} if info.version < 2 else {"r": None})
            rows.append(row)
        ranks = [r["r"] for r in rows if r["r"] is not None]
        out[config_key(c)] = {"shards": rows, "kib_mean": statistics.mean(r["bytes"] for r in rows) / 1024,
                              "rank_mean": statistics.mean(ranks) if ranks else float("nan"),
                              "rank_min": min(ranks, default=None), "rank_max": max(ranks, default=None)}
    return out


def shard_rows(info, cfgs, blobs, mbps: float, rebuild_ms: dict, execute_ms: dict) -> list[dict]:
    """Per shard: bytes and receive time of each config, its rebuild and execute times."""
    return [{"shard": s, "step": step, "layers": [l0, l1],
             "bytes": {config_key(c): sum(map(len, blobs[(s, c)].values())) for c in cfgs},
             "receive_ms": {config_key(c): 8e3 * sum(map(len, blobs[(s, c)].values())) / (mbps * 1e6) for c in cfgs},
             "rebuild_ms": {n: {k: v[s] for k, v in per.items()} for n, per in rebuild_ms.items()},
             "execute_ms": {n: v[s] for n, v in execute_ms.items()}}
            for s, (step, l0, l1) in enumerate(info.shards)]


def summarise(rebuild, execute, main_key: str, ranks: dict) -> dict:
    """Means, rebuild / execute ratios, hidden shares and the rank at the budget, per reconstructor /
    executor pair (``ranks``: config key -> its levels' mean rank; ``pipelined`` is filled by the caller)."""
    summary: dict = {"rebuild_ms_mean": {n: {k: statistics.mean(v) for k, v in per.items()}
                                         for n, per in rebuild.ms.items()},
                     "execute_ms_mean": {n: statistics.mean(v) for n, v in execute.ms.items()},
                     "rebuild_over_execute": {}, "rebuild_over_execute_by_config": {}, "hidden_share": {},
                     "pipelined": {}, "rebuild_budget": REBUILD_BUDGET, "rank_at_budget": {},
                     # best-of-repeats per shard, averaged: an estimate of the uncontended times
                     "rebuild_ms_min_mean": {n: {k: statistics.mean(v) for k, v in per.items()}
                                             for n, per in rebuild.min_ms.items()},
                     "execute_ms_min_mean": {n: statistics.mean(v) for n, v in execute.min_ms.items()}}
    for rn, per in rebuild.ms.items():
        for en, ev in execute.ms.items():
            rb = per[main_key]
            summary["rebuild_over_execute"][f"{rn}/{en}"] = sum(rb) / sum(ev)
            summary["rebuild_over_execute_by_config"][f"{rn}/{en}"] = {k: sum(v) / sum(ev) for k, v in per.items()}
            summary["hidden_share"][f"{rn}/{en}"] = hidden_share(rb, ev)
            means = summary["rebuild_ms_mean"][rn]
            summary["rank_at_budget"][f"{rn}/{en}"] = rank_at_budget(
                [ranks.get(k) for k in means], list(means.values()), summary["execute_ms_mean"][en])
    return summary
