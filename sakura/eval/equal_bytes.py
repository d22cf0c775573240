"""Fig. 15: quality against bytes sent for SAKURA, IntQ and CacheGen over each one's whole byte range.

A static sweep — no link, no clock. For each template of a workload and each operating point of a
system, the chosen byte ranges are read from the pack folder, decoded with the system's stream
encoding (as the device runtime gets it) and the masked edit runs on the rebuilt cache; quality is
measured against the FP16-cache output of the same request. Operating points:

* SAKURA (v2 pack) and SAKURA v1 pack (the ``sakura-v1`` file, the same rule) — per-shard byte budgets,
  geometric from the smallest frontier point to the largest; each shard takes the best frontier level
  within the budget (the allocator's rule);
* IntQ — each stored bit width for the whole edit; CacheGen — each stored level for the whole edit
  (a level is its ``label`` within a fetch unit, whatever the units are).

The curves are compared at equal quality (byte saving) and at equal bytes (quality gain) by
interpolating each system's Pareto points linearly in log-bytes, only where the curves overlap.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from sakura.eval import bench
from sakura.eval.plots import fig_quality_vs_bytes
from sakura.formats import FetchUnit, Level, file_id
from sakura.net.refs import resolving
from sakura.online.policies import best_within
from sakura.quality import quality
from sakura.systems import OURS, SYSTEMS
from sakura.systems import label as system_label

SWEPT = ("sakura", "sakura-v1", "intq", "cachegen")
# curves that are not systems: the stored format they sweep (issue #18's before: the v1 pack, SAKURA's rule)
VARIANT_FORMATS = {"sakura-v1": "sakura-v1"}
BUDGETED = ("sakura", "sakura-v1")  # swept by per-shard byte budgets (the allocator's rule)
METRICS = ("psnr", "ssim", "psnr_masked", "ssim_masked")
Choose = Callable[[FetchUnit], Level]


# -- operating points -------------------------------------------------------------------------------
def level_labels(units: list[FetchUnit]) -> list[str]:
    """Every level label of a stream, smallest total first (IntQ widths, CacheGen levels)."""
    totals: dict[str, int] = {}
    for u in units:
        for lv in u.levels:
            totals[lv.label] = totals.get(lv.label, 0) + lv.nbytes
    return sorted(totals, key=totals.get)


def by_label(label: str) -> Choose:
    return lambda u: next(lv for lv in u.levels if lv.label == label)


def within(budget: float) -> Choose:
    return lambda u: best_within(u.levels, budget)[0]


def sakura_budgets(units_per_template: list[list[FetchUnit]], n: int) -> list[float]:
    """``n`` per-shard budgets, geometric from the smallest frontier point to the largest allocated one (all
    templates) — the points of packs without a ladder, unchanged — then, where the pack has a ladder
    (rungs above the allocated levels, up to the FP16 values), ``max(3, n // 2)`` more up to its top."""
    sizes = [lv.nbytes for units in units_per_template for u in units for lv in u.levels if not lv.rung]
    rungs = [lv.nbytes for units in units_per_template for u in units for lv in u.levels if lv.rung]
    lo, hi = max(1, min(sizes)), max(sizes)
    out = [float(b) for b in (np.geomspace(lo, hi, n) if n > 1 else [hi])]
    if rungs and max(rungs) > hi:
        out += [float(b) for b in np.geomspace(hi, max(rungs), max(3, n // 2) + 1)[1:]]
    return out


# -- one operating point ------------------------------------------------------------------------------
def rebuild(encoding, source, fid: str, choose: Choose) -> tuple[dict, int, list[str]]:
    """Fetch and decode every fetch unit at the chosen level: ``(kv, bytes fetched, labels)``."""
    kv, nbytes, labels = {}, 0, []
    for unit in encoding.units:
        unit = encoding.priced(unit)
        level = choose(unit)
        ranges = encoding.ranges(unit, level)
        kv.update(encoding.decode(unit, level, source.fetch(fid, ranges)))
        nbytes += sum(n for _, n in ranges)
        labels.append(level.label)
    return kv, nbytes, labels


def measure(prepared, system: str, choose: Choose, requests: list[int], source=None) -> dict:
    """One operating point on one template: bytes sent and each request's quality vs its FP16-cache output."""
    fmt = format_of(system)
    encoding = prepared.runtime.encoding(prepared.state, fmt)
    fid = file_id(prepared.template.id, fmt)
    kv, nbytes, labels = rebuild(encoding, resolving(source or prepared.runtime.source, fid, encoding), fid, choose)
    rows = []
    for i in requests:
        req = prepared.request(i)
        image = prepared.model.masked_edit(req, lambda step, layer: kv[(step, layer)]).image
        rows.append(quality(image, prepared.reference(i), req.mask))
    return {"bytes": nbytes, "levels": sorted(set(labels)),
            **{m: float(np.mean([r[m] for r in rows])) for m in METRICS}, "per_request": rows}


@contextmanager
def torch_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def format_of(system: str) -> str:
    return VARIANT_FORMATS[system] if system in VARIANT_FORMATS else SYSTEMS[system].format


def plans(benches: list, systems, budgets: int) -> dict[str, list[tuple[dict, Choose]]]:
    """Per system, its operating points: (what identifies the point, how each fetch unit chooses)."""
    out = {}
    for s in systems:
        encs = [p.runtime.encoding(p.state, format_of(s)) for p in benches]
        if s in BUDGETED:  # a larger budget that picks the same levels everywhere is the same point
            out[s], seen = [], set()
            for b in sakura_budgets([e.units for e in encs], budgets):
                picks = tuple(within(b)(u).label for e in encs for u in e.units)
                if picks not in seen:
                    seen.add(picks)
                    out[s].append(({"config": f"{b / 1e3:.1f} kB/shard", "budget_per_shard": b}, within(b)))
        else:
            out[s] = [({"config": lab}, by_label(lab)) for lab in level_labels(encs[0].units)]
    return out


def sweep(benches: list, requests: int = 2, budgets: int = 10, systems=SWEPT, progress=None,
          label: str = "fig 15") -> dict[str, list[dict]]:
    """Per system, its operating points (ascending bytes) averaged over templates and requests;
    ``per_template`` keeps each template's own bytes and quality."""
    todo = plans(benches, systems, budgets)
    task = progress.add_task(label, total=sum(map(len, todo.values())) * len(benches)) if progress else None
    out: dict[str, list[dict]] = {}
    with torch_threads(1):
        for s, points in todo.items():
            rows = []
            for ident, choose in points:
                per = []
                for p in benches:
                    reqs = list(range(min(requests, len(p.template.eval_requests))))
                    per.append({"template": p.template.id, **measure(p, s, choose, reqs)})
                    if progress:
                        progress.advance(task)
                rows.append({**ident, **{k: float(np.mean([r[k] for r in per])) for k in ("bytes", *METRICS)},
                             # some shard at a ladder rung above the pack's allocated levels (issue #34)
                             "ladder": any(lab.startswith("rung ") for r in per for lab in r["levels"]),
                             "per_template": per})
            out[s] = sorted(rows, key=lambda r: r["bytes"])
    return out


# -- equal quality / equal bytes ------------------------------------------------------------------
def pareto(points: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """(log10 bytes, quality) of the points no cheaper point matches: both strictly increasing."""
    lb, q = [], []
    for b, v in sorted(points):
        if not q or v > q[-1]:
            if lb and np.log10(b) == lb[-1]:
                q[-1] = v
                continue
            lb.append(float(np.log10(b)))
            q.append(float(v))
    return np.asarray(lb), np.asarray(q)


def bytes_at(curve, quality_level: float) -> float | None:
    """Fewest bytes reaching ``quality_level`` on a Pareto curve; None outside its quality range."""
    lb, q = curve
    if not len(q) or quality_level < q[0] or quality_level > q[-1]:
        return None
    return float(10 ** np.interp(quality_level, q, lb))


def quality_at(curve, nbytes: float) -> float | None:
    """Best quality within ``nbytes`` on a Pareto curve; None outside its byte range."""
    lb, q = curve
    x = np.log10(nbytes)
    if not len(q) or x < lb[0] - 1e-12 or x > lb[-1] + 1e-12:
        return None
    return float(np.interp(x, lb, q))


def compare(ours: list[tuple[float, float]], other: list[tuple[float, float]], n: int = 5) -> dict:
    """SAKURA (``ours``) against a baseline, each a list of (bytes, quality): the byte saving at ``n``
    equal-quality levels and the quality gain at ``n`` equal-byte levels, only inside the overlap."""
    a, b = pareto(ours), pareto(other)
    res: dict = {"ours_bytes": [10 ** a[0][0], 10 ** a[0][-1]], "other_bytes": [10 ** b[0][0], 10 ** b[0][-1]],
                 "ours_quality": [a[1][0], a[1][-1]], "other_quality": [b[1][0], b[1][-1]]}
    q_lo, q_hi = max(a[1][0], b[1][0]), min(a[1][-1], b[1][-1])
    if q_lo <= q_hi:
        levels = np.linspace(q_lo, q_hi, n)
        rows = [{"quality": float(v), "ours_bytes": bytes_at(a, v), "other_bytes": bytes_at(b, v)} for v in levels]
        for r in rows:
            r["saving"] = 1 - r["ours_bytes"] / r["other_bytes"]
        res["equal_quality"] = {"points": rows, "mean_saving": float(np.mean([r["saving"] for r in rows]))}
    else:
        res["equal_quality"] = None
    b_lo, b_hi = max(a[0][0], b[0][0]), min(a[0][-1], b[0][-1])
    if b_lo <= b_hi:
        levels = 10 ** np.linspace(b_lo, b_hi, n)
        rows = [{"bytes": float(x), "ours": quality_at(a, x), "other": quality_at(b, x)} for x in levels]
        for r in rows:
            r["gain"] = r["ours"] - r["other"]
        res["equal_bytes"] = {"points": rows, "mean_gain": float(np.mean([r["gain"] for r in rows]))}
    else:
        res["equal_bytes"] = None
    return res


def edit_curves(rows: list[dict], metric: str) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """One system's sweep split per edit: ``(template, request) → [(bytes, quality)]`` at every point."""
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for row in rows:
        for t in row["per_template"]:
            for i, q in enumerate(t["per_request"]):
                out.setdefault((t["template"], i), []).append((t["bytes"], q[metric]))
    return out


BANDS = ("low", "mid", "high")  # thirds of each edit's equal-quality overlap


def paired_savings(ours: list[dict], other: list[dict], metric: str = "psnr_masked", n: int = 9) -> dict | None:
    """The byte saving of ``ours`` over ``other`` at equal quality, **edit by edit**: each edit's own
    Pareto curves (bytes vs its quality), ``n`` quality levels evenly over that edit's overlap. Pooling
    first (``compare``) averages different edits' non-monotone curves and mixes their quality scales;
    pairing removes both. Per band (thirds of the overlap): median, 25th percentile and count."""
    a_by, b_by = edit_curves(ours, metric), edit_curves(other, metric)
    by_band: dict[str, list[float]] = {b: [] for b in BANDS}
    edits = 0
    for key in a_by.keys() & b_by.keys():
        a, b = pareto(a_by[key]), pareto(b_by[key])
        lo, hi = max(a[1][0], b[1][0]), min(a[1][-1], b[1][-1])
        if not len(a[1]) or not len(b[1]) or hi <= lo:
            continue
        edits += 1
        for j, v in enumerate(np.linspace(lo, hi, n)):
            by_band[BANDS[min(3 * j // n, 2)]].append(1 - bytes_at(a, v) / bytes_at(b, v))
    if not edits:
        return None
    stats = {band: {"median": float(np.median(v)), "p25": float(np.percentile(v, 25)), "count": len(v)}
             for band, v in by_band.items() if v}
    every = [x for v in by_band.values() for x in v]
    return {"edits": edits, "levels_per_edit": n, "bands": stats, "median": float(np.median(every)),
            "p25": float(np.percentile(every, 25))}


def comparisons(curves: dict[str, list[dict]], metrics=("psnr_masked", "ssim_masked")) -> dict:
    """``{baseline: {metric: compare(...)}}`` for every swept baseline against SAKURA."""
    if OURS not in curves:
        return {}
    pts = {s: {m: [(r["bytes"], r[m]) for r in rows] for m in metrics} for s, rows in curves.items()}
    out = {s: {m: compare(pts[OURS][m], pts[s][m]) for m in metrics} for s in curves if s != OURS}
    for s in out:
        for m in metrics:
            out[s][m]["paired"] = paired_savings(curves["sakura"], curves[s], m)
    return out


# -- the figure ---------------------------------------------------------------------------------------
def overlap_notes(workload: str, comp: dict) -> list[str]:
    """One line per baseline and metric: byte ranges, the mean saving / gain over the overlap, or that
    the curves do not overlap (nothing is extrapolated)."""
    mb = lambda r: f"{r[0] / 1e6:.2f}–{r[1] / 1e6:.2f} MB"  # noqa: E731
    span = lambda lo, hi: f"{lo:.4g}–{hi:.4g}"  # noqa: E731
    lines = []
    for s, by_metric in comp.items():
        name = system_label(s)
        for m, c in by_metric.items():
            eq, eb = c["equal_quality"], c["equal_bytes"]
            if eq:
                saving = eq["mean_saving"]
                overlap = span(max(c["ours_quality"][0], c["other_quality"][0]),
                               min(c["ours_quality"][1], c["other_quality"][1]))
                q = f"{abs(saving):.0%} {'fewer' if saving >= 0 else 'more'} bytes at equal {m} (mean over {overlap})"
            else:
                q = f"no equal-{m} overlap (SAKURA {span(*c['ours_quality'])}, {name} {span(*c['other_quality'])})"
            b = f"{eb['mean_gain']:+.3g} {m} at equal bytes" if eb else "no equal-bytes overlap"
            lines.append(f"{workload} SAKURA ({mb(c['ours_bytes'])}) vs {name} ({mb(c['other_bytes'])}): {q}; {b}")
            if c.get("paired"):
                pr = c["paired"]
                bands = ", ".join(f"{k} {v['median']:.0%} (p25 {v['p25']:.0%})" for k, v in pr["bands"].items())
                lines.append(f"  edit by edit ({pr['edits']} edits): bytes saved at equal {m}, median per third "
                             f"of the overlap: {bands}")
    return lines


def fig15_bytes_quality(cfg, out: Path, cache: dict, progress, say, requests: int | None = None, budgets: int = 10
                        ) -> list[Path]:
    """Masked PSNR / SSIM vs bytes sent for SAKURA, IntQ and CacheGen on each workload's templates
    (``requests`` held-out requests per template, default ``cfg.quality_requests``; ``budgets`` SAKURA
    budgets); PNG + JSON."""
    import json

    requests = requests or cfg.quality_requests

    data: dict = {"requests_per_template": requests, "sakura_budgets": budgets, "reference": "FP16-cache output",
                  "workloads": {}}
    for workload in cfg.workloads:
        benches = bench.workload_benches(workload, cfg, cache, say)
        curves = sweep(benches, requests, budgets, progress=progress, label=f"fig 15 {workload}")
        comp = comparisons(curves)
        data["workloads"][workload] = {"templates": [p.template.id for p in benches],
                                       "fp16_bytes": float(np.mean([p.fp16_bytes for p in benches])),
                                       "curves": curves, "comparison": comp}
        for line in overlap_notes(workload, comp):
            say(line)
    png, js = out / "fig15_bytes_quality.png", out / "fig15_bytes_quality.json"
    fig_quality_vs_bytes(data, png)
    js.write_text(json.dumps(data, indent=1, default=float))
    return [png, js]
