"""Deadline prediction (paper §4.3.2): when execution will need a shard, as the device sees it now."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sakura.runtime.compute import ComputeProfile


def predict_need(shard: int, now: float, compute: "ComputeProfile", starts: list[float | None],
                 hold_until: float = 0.0) -> float:
    """When execution will reach ``shard``, predicted at ``now``: the shard in progress finishes on
    its measured time, later ones take their measured times, no stalls. ``starts[k]`` is when shard
    k started executing (None: not yet); shard 0 starts no sooner than ``hold_until`` (when the runtime
    predicts it: the start-up hold's end, or sooner when shard 0's bytes are through before it)."""
    t, c = max(compute.prelude_s, hold_until), compute.shard_s
    for k in range(shard):
        s = starts[k]
        if s is None or s > now:  # not started yet: waiting on data (or in the prelude)
            return max(now, t) + sum(c[k:shard])
        t = s + c[k]
    return max(now, t)
