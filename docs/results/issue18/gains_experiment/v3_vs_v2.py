"""Frontiers of two allocated packs of one template (e.g. v2 vs v3), and bytes of the second / the first at
equal estimated error. Usage: v3_vs_v2.py V2.pack V3.pack SHARDS (comma-separated)."""
import sys
from sakura.formats.pack import PackReader
a, b = PackReader(sys.argv[1]).info, PackReader(sys.argv[2]).info
import numpy as np
for s in [int(x) for x in sys.argv[3].split(",") if int(x) < a.num_shards]:
    f2, f3 = a.frontier(s), b.frontier(s)
    print("shard", s)
    print(" v2", [(c.r, c.b_a, c.b_b, c.bytes, c.error) for c in f2[:14]])
    print(" v3", [(c.r, c.b_a, c.b_b, c.bytes, c.error) for c in f3[:14]])
    c2 = np.array([(c.bytes, c.error) for c in f2]); c3 = np.array([(c.bytes, c.error) for c in f3])
    out = []
    for e in (0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.06):
        if c2[:, 1].min() <= e <= c2[:, 1].max() and c3[:, 1].min() <= e <= c3[:, 1].max():
            out.append(f"{e}:{np.interp(-e, -c3[:, 1], c3[:, 0]) / np.interp(-e, -c2[:, 1], c2[:, 0]):.3f}")
    print(" v3/v2 bytes at est. error", " ".join(out), "| top", f2[-1].bytes, f2[-1].error, f3[-1].bytes, f3[-1].error)
