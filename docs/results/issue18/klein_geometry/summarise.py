"""The README's tables from the bench-device reports in this folder: per report, mean rebuild ms per shard
(median of repeats) per configuration and reconstructor, mean execute ms per shard per executor, and
rebuild ÷ execute for each pair. For a v2 pack (report ``levels``) also the level each config read: the rank
it decodes to (min–max over shards) and its mean planes of A / B per component.

    python docs/results/issue18/klein_geometry/summarise.py [REPORT.json ...]   (default: every *.json here)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(path: Path) -> str:
    r = json.loads(path.read_text())
    s, g = r["summary"], r["geometry"]
    exes, recs = list(s["execute_ms_mean"]), list(s["rebuild_ms_mean"])
    pairs = [f"{rn}/{e}" for rn in recs for e in exes]
    v2 = r["pack"].get("version", 1) >= 2 and "levels" in r
    lv_head, lv_rule = ("v2 level rank | planes A/B | ", "---:|---:|") if v2 else ("", "")
    lines = [f"**{path.name}** — {r['template']}: d = {g['d']}, {g['double_blocks']} double + {g['single_blocks']} "
             f"single blocks, {g['steps']} steps, {g['masked_tokens']} masked + {g['reference_tokens']} reference + "
             f"{g['text_tokens']} text tokens computed, {g['reused_tokens']} reused; shard = {r['shard_size']} blocks; "
             f"execute ms/shard: " + ", ".join(f"{e} {s['execute_ms_mean'][e]:.0f}" for e in exes)
             + f"; load average {r['host']['load_avg_at_start'][0]:.1f} → {r['host']['load_avg_at_end'][0]:.1f}"
             + (f"; pack v2, {r['pack']['shared_shards']}/{r['pack']['shards']} shards share a basis" if v2 else ""),
             "", "| config (r, b_A, b_B) | " + lv_head + "KiB/shard | " + " | ".join(f"rebuild {rn} ms" for rn in recs)
             + " | " + " | ".join(pairs) + " |", "|---|" + lv_rule + "---:|" + "---:|" * (len(recs) + len(pairs))]
    kib = {k: sum(row["bytes"][k] for row in r["shards"]) / len(r["shards"]) / 1024 for k in r["shards"][0]["bytes"]}
    for k in s["rebuild_ms_mean"][recs[0]]:
        cells = [f"{s['rebuild_ms_mean'][rn][k]:.1f}" for rn in recs]
        cells += [f"{100 * s['rebuild_over_execute_by_config'][p][k]:.1f} %" for p in pairs]
        cfg = tuple(int(x[1:]) for x in k.split("-"))
        level = ""
        if v2:
            lv = r["levels"][k]
            rank = f"{lv['rank_min']}" if lv["rank_min"] == lv["rank_max"] else f"{lv['rank_min']}–{lv['rank_max']}"
            span = [sorted({row[f] for row in lv["shards"]}) for f in ("b_a", "b_b")]
            level = f"{rank} | " + " / ".join(f"{v[0]:g}" + (f"–{v[-1]:g}" if len(v) > 1 else "") for v in span) + " | "
        lines.append(f"| {cfg} | {level}{kib[k]:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    paths = [Path(p) for p in argv] or sorted(Path(__file__).parent.glob("*.json"))
    print("\n\n".join(table(p) for p in paths))


if __name__ == "__main__":
    main(sys.argv[1:])
