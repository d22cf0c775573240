"""How well does each rebuild model predict an edit's own rebuilds? For a random sample of a headline trace's SAKURA
edits: time each file's calibration sample (`time_decodes`, 4 units × 6 levels) and fit a proportional rate (Σ s / Σ
work) and an affine model (fixed + per work, `fit_affine`); replay the edit as the bench runs it and predict each of its
rebuilds before it happens, from (a) the proportional prior alone, (b) the affine prior alone, (c) the proportional rate
over the edit's last 8 rebuilds (the monitor on main), (d) the affine prior scaled by the last 8 rebuilds' time
over its prediction of them (tried in session 39, not kept). Prints |predicted − actual| / actual, median and p90.

    python docs/results/issue32/policy17/rebuild_models.py ../shared/traces/5g-walking-603s.csv \\
        --packs PACKS --calibration COPY_OF_CALIBRATION --edits 8
"""

import random
import sys
from pathlib import Path

import numpy as np
import torch

from sakura.eval import bench
from sakura.eval.bench import BenchConfig, regime_scales, run_one, workload_benches
from sakura.eval.plots import load_records
from sakura.net.traces import load_trace
from sakura.online.monitor import RebuildRate
from sakura.runtime.calibration import fit_affine, time_decodes
from sakura.runtime.session import Network

HEADLINE = Path(__file__).resolve().parents[1] / "headline"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rebuild_samples import parse_args  # noqa: E402  (the same arguments)

WINDOW = 8
MODELS = ("proportional prior", "affine prior", "proportional, learnt", "affine prior, scaled")


def predictions(seen: list[tuple[float, float]], prop: float, a: float, b: float) -> list[tuple[float, ...]]:
    """Per rebuild (work, seconds) of ``seen``: each model's prediction from the rebuilds before it."""
    out = []
    for i, (w, _) in enumerate(seen):
        window = seen[max(0, i - WINDOW):i]
        learnt = sum(s for _, s in window) / sum(v for v, _ in window) * w if window else prop * w
        scale = sum(s for _, s in window) / sum(a + b * v for v, _ in window) if window else 1.0
        out.append((prop * w, a + b * w, learnt, scale * (a + b * w)))
    return out


def main() -> None:
    a = parse_args(8, 2)
    torch.set_num_threads(1)
    bench.use_rebuild_clock("cpu")
    seen: list[tuple[float, float]] = []
    observe = RebuildRate.observe

    def recorded(self, work, seconds):
        if work > 0:
            seen.append((work, seconds))
        observe(self, work, seconds)

    RebuildRate.observe = recorded
    runs = [r for r in load_records(HEADLINE / a.trace.stem / "records.jsonl.gz") if r["system"] == "sakura"]
    picked = random.Random(a.seed).sample(runs, min(a.edits, len(runs)))
    base = load_trace(str(a.trace))
    errors: list[list[float]] = [[] for _ in MODELS]
    for workload in sorted({r["workload"] for r in picked}):
        cfg = BenchConfig(workloads=(workload,), systems=("sakura",), trace=str(a.trace), packs=a.packs,
                          calibration_file=a.calibration)
        prepared = {p.template.id: p for p in workload_benches(workload, cfg, {}, lambda *_: None)}
        scales = regime_scales(list(prepared.values()), base, cfg)
        fits: dict[str, tuple[float, float, float]] = {}
        for r in (r for r in picked if r["workload"] == workload):
            p = prepared[r["template"]]
            if r["template"] not in fits:
                s = p.session("sakura", Network(base, base.name, 0.0, scale=1.0))
                read = lambda ranges: s.source.fetch_timed(s.file_id, ranges).parts  # noqa: E731
                timed = [d for d in time_decodes(s.encoding, read) if d.level.work > 0]
                work, secs = [d.level.work for d in timed], [d.seconds for d in timed]
                fits[r["template"]] = (sum(secs) / sum(work), *fit_affine(work, secs))
            prop, fixed, per = fits[r["template"]]
            seen.clear()
            run_one(p, r["request"], "sakura", base.scaled(scales[r["template"]]), r["start_s"], say=lambda *_: None)
            for (_, actual), predicted in zip(seen, predictions(seen, prop, fixed, per)):
                for k, x in enumerate(predicted):
                    errors[k].append(abs(x - actual) / actual)
            print(f"{workload} {r['template']} {r['start_s']:.1f}: {prop * 1e12:.0f} ps/work, or {fixed * 1e3:.2f} ms "
                  f"+ {per * 1e12:.0f} ps/work; {len(seen)} rebuilds", flush=True)
    for name, e in zip(MODELS, errors):
        print(f"{name:22s} |error| median {np.median(e):.2f}, p90 {np.percentile(e, 90):.2f} ({len(e)} rebuilds)")


if __name__ == "__main__":
    main()
