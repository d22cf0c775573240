"""The tables of this folder's README from its records (``ab/ARM-TRACE-records.jsonl.gz``): the priced start-up hold
against the fixed one, when execution starts against the hold's end, and the "true future rates" run before and after
it got SAKURA's stall budget.

    python docs/results/issue32/policy18/ab_tables.py
"""

import gzip
import json
from pathlib import Path

import numpy as np

AB = Path(__file__).parent / "ab"
DISPLAY_DB = 58.9  # (PSNR counted at most at the display's: an 8-bit output's own rounding)
TRACES = {"5gw": "5G walking", "4gd": "4G driving", "mix": "4G+5G mixed"}


def load(arm: str, trace: str, system: str) -> dict:
    with gzip.open(AB / f"{arm}-{trace}-records.jsonl.gz", "rt") as f:
        return {(r["template"], r["request"], round(r["start_s"], 3)): r for r in map(json.loads, f)
                if r["system"] == system}


def pct(xs, q: float) -> float:
    return float(np.percentile(xs, q))


def regret(rows: dict, key: str) -> list[float]:
    return [r["regret"][key] for r in rows.values() if r.get("regret")]


def capped(r: dict) -> float:
    return min(r["psnr_masked"], DISPLAY_DB)


def against_optimum(rows: dict) -> str:
    """Latency / optimal at p90 · visible gap at p90."""
    return f"{pct(regret(rows, 'latency_ratio'), 90):.3f} · {pct(regret(rows, 'psnr_gap_visible_db'), 90):.1f}"


def hold_table() -> None:
    print("| trace | hold 1.5 (main): latency p50 / p90 (s) · capped PSNR mean · latency / optimal p90 · visible gap "
          "p90 | priced, 1× the stall budget's price: latency ×p50 / ×p90 · Δ capped mean · better / worse · "
          "latency / optimal p90 · visible gap p90 | priced, 0.5×: the same |")
    print("|---|---|---|---|")
    for trace, name in TRACES.items():
        base = load("base", trace, "sakura")
        keys = sorted(base)
        lat = [base[k]["latency_s"] for k in keys]
        mean = np.mean([capped(base[k]) for k in keys])
        cells = [name, f"{pct(lat, 50):.3f} / {pct(lat, 90):.3f} · {mean:.1f} · {against_optimum(base)}"]
        for arm in ("p1", "p05"):
            rows = load(arm, trace, "sakura")
            la = [rows[k]["latency_s"] for k in keys]
            dc = [capped(rows[k]) - capped(base[k]) for k in keys]
            cells.append(f"×{pct(la, 50) / pct(lat, 50):.3f} / ×{pct(la, 90) / pct(lat, 90):.3f} · "
                         f"{np.mean(dc):+.2f} · {sum(x > 0.5 for x in dc)} / {sum(x < -0.5 for x in dc)} · "
                         f"{against_optimum(rows)}")
        print("| " + " | ".join(cells) + " |")


def startup_shares() -> None:
    """When shard 0 started (``startup_s``, from the edit's start) over the fixed hold's end (1.5 gate leads: the
    calibrated compute of shards 0 and 1, ``../headline/calibration.json``, replayed by every arm)."""
    machines = json.loads((AB.parent.parent / "headline" / "calibration.json").read_text())["machines"]
    profiles = next(m["profiles"] for m in machines.values() if m["machine"]["cpu"] == "AMD EPYC")
    lead = {key.split("/")[1]: sum(p["shard_s"][:2]) for key, p in profiles.items()}
    for arm in ("base", "p1", "p05"):
        shares = np.array([r["startup_s"] / (1.5 * lead[r["template"]])
                           for trace in TRACES for r in load(arm, trace, "sakura").values()])
        print(f"{arm}: start / fixed hold's end p10 {pct(shares, 10):.2f} p50 {pct(shares, 50):.2f} "
              f"p90 {pct(shares, 90):.2f}; at the end or later {int((shares >= 0.97).sum())} of {len(shares)}")


def perfect_table() -> None:
    print("| trace | true future rates, no stall budget (before) | with SAKURA's stall budget (after) | SAKURA, "
          "same run as after |")
    print("|---|---|---|---|")
    for trace, name in TRACES.items():
        cells = [name]
        for arm, system in (("old", "sakura+perfect"), ("base", "sakura+perfect"), ("base", "sakura")):
            rows = load(arm, trace, system)
            lat = [r["latency_s"] for r in rows.values()]
            gap = regret(rows, "psnr_gap_db")
            mean = np.mean([capped(r) for r in rows.values()])
            cells.append(f"{pct(lat, 50):.3f} / {pct(lat, 90):.3f} · {mean:.2f} · "
                         f"{pct(gap, 50):.2f} / {pct(gap, 90):.2f}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    hold_table()
    print()
    startup_shares()
    print()
    perfect_table()
