"""Bytes of the new pack over v1's at equal stored error, per template and byte band, from the pack
headers (every frontier point of every shard; v2 errors are the allocation's estimates, within ~1 % of
the exact metric — checked by exact_check.py). Usage: frontier_ratio.py NEW_PACKS [OTHER_V2_PACKS]
(OTHER: the same ratio for a second v2 folder, e.g. one token basis per unit)."""
import sys, glob, json, numpy as np
from pathlib import Path
from sakura.formats.pack import PackReader


def curve(front):
    out = []
    for b, e in sorted((c.bytes, c.error) for c in front):
        if not out or e < out[-1][1]:
            out.append((b, e))
    return np.array(out)


def ratios(new: PackReader, old: PackReader) -> np.ndarray:
    rows = []
    for s in range(new.info.num_shards):
        c1 = curve(old.frontier(s))
        for c in new.frontier(s):
            if c1[-1, 1] <= c.error <= c1[0, 1]:
                b1 = 10 ** np.interp(-c.error, -c1[:, 1], np.log10(c1[:, 0]))
                rows.append((b1, c.bytes / b1))
    return np.array(rows)


def bands(rows: np.ndarray, n: int = 6) -> list[tuple[float, float, float]]:
    edges = np.geomspace(rows[:, 0].min(), rows[:, 0].max() * 1.001, n + 1)
    return [(lo, hi, float(np.median(r[:, 1]))) for lo, hi in zip(edges[:-1], edges[1:])
            for r in [rows[(rows[:, 0] >= lo) & (rows[:, 0] < hi)]] if len(r)]


folders = sys.argv[1:]
for bj in sorted(glob.glob(f"{folders[0]}/*.build.json")):
    t = json.loads(Path(bj).read_text())["template_id"]
    v1 = PackReader(f"{folders[0]}/{t}.v1.pack")
    for folder in folders:
        new = PackReader(f"{folder}/{t}.pack")
        shared = new.info.header.get("shared_shards")
        label = f"{t} {'shared' if shared and any(shared) else 'unit'}-basis v2 / v1"
        print(f"{label:<44}", "  ".join(f"[{lo / 1e3:.0f}–{hi / 1e3:.0f} kB] {r:.2f}" for lo, hi, r in bands(ratios(new, v1))))
