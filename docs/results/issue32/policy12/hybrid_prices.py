"""python docs/results/issue32/policy12/hybrid_prices.py <sakura cli args...>: the CLI with each shard's level table
scaled to its weight (a level's price = level_mse · w_j / w0_j, w0_j the same anchors' ratio on the table's one request):
the table's shape within a shard, the weight's magnitude across shards (the "hybrid" arm of this pass)."""
import math, sys
import numpy as np
from sakura.formats import pack as P
from sakura.offline.output_weights import anchor_levels
from sakura.formats.base import Level

orig = P.PackEncoding._levels
def _levels(self, shard):
    levels = orig(self, shard)
    if self._level_mse is None:
        return levels
    row = self._level_mse[shard]
    raw = [c.error for c in self.info.frontier(shard)]
    raw_levels = [Level(lv.label, lv.nbytes, e) for lv, e in zip(levels, raw)]
    m = dict(zip((lv.label for lv in levels), row))
    ratios = [m[a.label] / a.error for a in anchor_levels(raw_levels) if m[a.label] > 0]
    w = self._weight(shard)
    if not ratios or w <= 0:
        return levels
    w0 = math.exp(np.mean(np.log(ratios)))
    scale = w / w0
    return tuple(Level(lv.label, lv.nbytes, lv.error * scale, lv.key, work=lv.work, rung=lv.rung) for lv in levels)
P.PackEncoding._levels = _levels
print("hybrid level prices", file=sys.stderr)
from sakura.cli import app
sys.argv[0] = "sakura"
app()
