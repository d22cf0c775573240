"""Rebuild cost per shard against bytes: SAKURA's frontier and CacheGen's stored levels, on this machine.

``python -m sakura.eval.decode_cost --packs DIR --templates fs-astronaut,mb-coffee --out DIR``

One torch thread for both systems. Every point decodes bytes already in memory (CRC checks included,
as on the device); its time is the minimum over ``repeats`` runs, taken in rounds that interleave
every point so a busy machine slows all of them alike. CacheGen's level tables are parsed and their
coder models built in a warm-up round (once per level per edit on the device; timed apart as
``table_ms``). Each CacheGen level is compared with SAKURA's frontier at the same bytes
(log-interpolated between the measured SAKURA points, clamped at its ends). Writes
``decode_cost.json`` and ``decode_cost.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from sakura.formats import cachegen, file_id, pack
from sakura.systems import OURS, color

BASELINE = "cachegen"  # the system whose decode this study prices against ours, at the same bytes


def _points(packs: Path, template: str, shards: int, sakura_points: int) -> list[dict]:
    """Every (system, level, shard) to time, with its decode as a closure over received bytes."""
    sk = pack.PackReader(packs / f"{file_id(template, OURS)}.pack")
    cg = cachegen.CacheGenReader(packs / f"{file_id(template, BASELINE)}.pack")
    picked = sorted({round(i * (sk.info.num_shards - 1) / max(1, shards - 1)) for i in range(shards)})
    points = []
    for s in picked:
        frontier = sk.frontier(s)
        idx = sorted({round(i * (len(frontier) - 1) / max(1, sakura_points - 1)) for i in range(sakura_points)})
        for k, c in enumerate(frontier[i] for i in idx):  # grouped by frontier position across shards
            blobs = sk.read(s, *c.key)
            points.append({"system": OURS, "level": f"#{k}", "config": f"r{c.r}/a{c.b_a}/b{c.b_b}", "shard": s,
                           "bytes": sum(map(len, blobs.values())),
                           "run": lambda s=s, c=c, b=blobs: pack.decode_shard(sk.info, s, *c.key, b)})
        for lv in range(cg.info.num_levels):
            blobs = cg.read(s, lv)
            points.append({"system": BASELINE, "level": f"L{lv}", "shard": s, "bytes": cg.info.shard_range(s, lv)[1],
                           "run": lambda s=s, lv=lv, b=blobs: cachegen.decode_shard(cg.info, s, cg.models(lv), b)})
    return points


def _table_ms(packs: Path, template: str) -> dict[str, dict]:
    """Per CacheGen level: its table bytes and the time to parse it and build every group's models."""
    cg = cachegen.CacheGenReader(packs / f"{file_id(template, BASELINE)}.pack")
    out = {}
    for lv in range(cg.info.num_levels):
        t0 = time.perf_counter()
        models = cg.models(lv)
        for group in cg.info.geometry.groups():
            models[group]
        out[f"L{lv}"] = {"table_bytes": cg.info.table_range(lv)[1], "table_ms": (time.perf_counter() - t0) * 1e3}
    return out


def measure(packs: Path, template: str, shards: int = 4, sakura_points: int = 12, repeats: int = 5) -> dict:
    points = _points(packs, template, shards, sakura_points)
    times = [[] for _ in points]
    for _ in range(repeats + 1):  # the first round warms up (page faults, lazily built models)
        for p, ts in zip(points, times):
            t0 = time.perf_counter()
            p["run"]()
            ts.append((time.perf_counter() - t0) * 1e3)
    rows: dict[tuple[str, str], dict] = {}
    for p, ts in zip(points, times):
        row = rows.setdefault((p["system"], p["level"]), {"system": p["system"], "level": p["level"],
                                                          "configs": [], "bytes": [], "ms": []})
        row["configs"].append(p.get("config", p["level"]))
        row["bytes"].append(p["bytes"])
        row["ms"].append(min(ts[1:]))
    out = [{**r, "bytes": float(np.mean(r["bytes"])), "ms": float(np.median(r["ms"]))} for r in rows.values()]
    sk = sorted((r for r in out if r["system"] == OURS), key=lambda r: r["bytes"])
    tables = _table_ms(packs, template)
    for r in out:
        if r["system"] == BASELINE:
            at = float(np.interp(np.log(r["bytes"]), [np.log(s["bytes"]) for s in sk], [s["ms"] for s in sk]))
            r.update(tables[r["level"]], sakura_ms_at_bytes=at, ratio=r["ms"] / at)
    return {"template": template, "shards": shards, "repeats": repeats, "torch_threads": torch.get_num_threads(),
            "points": sorted(out, key=lambda r: (r["system"], r["bytes"]))}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.6), squeeze=False)
    for ax, res in zip(axes[0], results):
        for system, marker in ((OURS, "o-"), (BASELINE, "s--")):
            pts = [p for p in res["points"] if p["system"] == system]
            ax.plot([p["bytes"] / 1e3 for p in pts], [p["ms"] for p in pts], marker, color=color(system),
                    label=system, ms=4)
        ax.set_xscale("log")
        ax.set_xlabel("bytes per shard (KB)")
        ax.set_ylabel("rebuild per shard (ms, 1 thread)")
        ax.set_title(res["template"], fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", type=Path, required=True)
    ap.add_argument("--templates", required=True, help="comma-separated template ids")
    ap.add_argument("--out", type=Path, default=Path("decode_cost"))
    ap.add_argument("--shards", type=int, default=4, help="shards sampled per template (evenly spaced)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    results = [measure(args.packs, t, args.shards, repeats=args.repeats) for t in args.templates.split(",")]
    console = Console(width=130)
    for res in results:
        table = Table(title=f"{res['template']}: rebuild per shard (1 thread, min of {res['repeats']}, median over "
                            f"{res['shards']} shards)")
        for col in ("system", "level", "KB / shard", "ms / shard", "SAKURA ms at same bytes", "ratio",
                    "table KB", "table ms"):
            table.add_column(col, justify="left" if col in ("system", "level") else "right")
        for p in res["points"]:
            cg = p["system"] == BASELINE
            level = p["level"] if cg else f"{p['level']} {p['configs'][len(p['configs']) // 2]}"
            extra = (f"{p['sakura_ms_at_bytes']:.2f}", f"{p['ratio']:.2f}×", f"{p['table_bytes'] / 1e3:.1f}",
                     f"{p['table_ms']:.1f}") if cg else ("", "", "", "")
            table.add_row(p["system"], level, f"{p['bytes'] / 1e3:.1f}", f"{p['ms']:.2f}", *extra)
        console.print(table)
    (args.out / "decode_cost.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "decode_cost.png")
    console.print(f"wrote {args.out / 'decode_cost.json'} and {args.out / 'decode_cost.png'}")


if __name__ == "__main__":
    main()
