"""Two packs folders' per-level output MSE tables, per template: the ratio B / A over every level (median, p10,
p90) and per shard (geometric mean, first 12 shards).

    python docs/results/issue32/policy13/compare_tables.py PACKS_A PACKS_B TEMPLATE...
"""
import sys

import numpy as np

from sakura.formats import FORMATS

fmt = FORMATS["sakura"]
packs_a, packs_b, *templates = sys.argv[1:]
for tid in templates:
    a = fmt.encoding_cls(fmt.open(f"{packs_a}/{fmt.file_id(tid)}.pack")).level_output_mse()
    b = fmt.encoding_cls(fmt.open(f"{packs_b}/{fmt.file_id(tid)}.pack")).level_output_mse()
    pairs = [[(x, y) for x, y in zip(ra, rb) if x > 0 and y > 0] for ra, rb in zip(a, b)]
    r = np.array([y / x for shard in pairs for x, y in shard])
    per_shard = [np.exp(np.mean([np.log(y / x) for x, y in shard])) for shard in pairs]
    print(f"| {tid} | {np.median(r):.2f} | {np.percentile(r, 10):.2f} / {np.percentile(r, 90):.2f} | "
          + " ".join(f"{x:.2f}" for x in per_shard[:12]) + " |")
