"""Per shard: SAKURA's chosen level against the equal-latency optimum's ((b), `equal_latency_actions`), from a
`sakura bench --regret` run's records. Usage: python levels_vs_optimum.py RECORDS.jsonl[.gz] [SYSTEM]"""

import gzip
import json
import re
import sys
from collections import defaultdict

import numpy as np

path, system = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "sakura")
lines = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read().splitlines()
rows = [r for r in map(json.loads, lines) if r["system"] == system and (r.get("regret") or {}).get(
    "equal_latency_actions")]


def rank(label) -> float:
    """The mean rank of a shard's stored levels (r<rank>/...), NaN for a fallback or an empty label."""
    ranks = [int(m) for m in re.findall(r"r(\d+)/", json.dumps(label))]
    return float(np.mean(ranks)) if ranks else float("nan")


by_shard = defaultdict(lambda: ([], []))
for r in rows:
    for j, (own, opt) in enumerate(zip(r["levels"], r["regret"]["equal_latency_actions"])):
        by_shard[j][0].append(rank(own))
        by_shard[j][1].append(rank(opt))
print(f"{len(rows)} edits of {system}; mean rank per shard (own vs the optimum at equal latency):")
for j, (own, opt) in sorted(by_shard.items()):
    print(f"shard {j:2d}: {np.nanmean(own):6.1f}  {np.nanmean(opt):6.1f}")
print("example optimum actions:", json.dumps(rows[0]["regret"]["equal_latency_actions"])[:400] if rows else "-")
