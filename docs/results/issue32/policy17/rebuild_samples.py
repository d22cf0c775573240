"""Is an edit's first timed rebuild slower than the device's calibrated rate? For a random sample of a headline
trace's SAKURA edits, replay each as the bench runs it (simulated clock, rebuilds timed on the CPU clock, the
calibration replayed) and print the prior it started from and every rebuild its monitor saw, in ps per unit of work,
in order (``--detail``: each rebuild's work and time too).

    python docs/results/issue32/policy17/rebuild_samples.py ../shared/traces/5g-walking-603s.csv \\
        --packs PACKS --calibration COPY_OF_CALIBRATION --edits 12
"""

import argparse
import random
from pathlib import Path

import torch

from sakura.eval import bench
from sakura.eval.bench import BenchConfig, regime_scales, run_one, workload_benches
from sakura.eval.plots import load_records
from sakura.net.traces import load_trace
from sakura.online.monitor import RebuildRate

HEADLINE = Path(__file__).resolve().parents[1] / "headline"


def parse_args(edits: int, seed: int, extra=lambda ap: None) -> argparse.Namespace:
    """A headline trace, the packs and calibration to replay it with, and how many of its edits to sample."""
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", type=Path)
    ap.add_argument("--packs", type=Path, required=True)
    ap.add_argument("--calibration", type=Path, required=True)
    ap.add_argument("--edits", type=int, default=edits)
    ap.add_argument("--seed", type=int, default=seed)
    extra(ap)
    return ap.parse_args()


def main() -> None:
    a = parse_args(12, 1, lambda ap: ap.add_argument("--detail", action="store_true"))
    torch.set_num_threads(1)
    bench.use_rebuild_clock("cpu")
    seen: list[tuple[float, float, float]] = []  # (prior, work, seconds) per rebuild with work
    observe = RebuildRate.observe

    def recorded(self, work, seconds):
        if work > 0:
            seen.append((self.prior, work, seconds))
        observe(self, work, seconds)

    RebuildRate.observe = recorded
    runs = [r for r in load_records(HEADLINE / a.trace.stem / "records.jsonl.gz") if r["system"] == "sakura"]
    picked = random.Random(a.seed).sample(runs, min(a.edits, len(runs)))
    base = load_trace(str(a.trace))
    for workload in sorted({r["workload"] for r in picked}):
        cfg = BenchConfig(workloads=(workload,), systems=("sakura",), trace=str(a.trace), packs=a.packs,
                          calibration_file=a.calibration)
        prepared = {p.template.id: p for p in workload_benches(workload, cfg, {}, lambda *_: None)}
        scales = regime_scales(list(prepared.values()), base, cfg)
        for r in (r for r in picked if r["workload"] == workload):
            seen.clear()
            run_one(prepared[r["template"]], r["request"], "sakura", base.scaled(scales[r["template"]]),
                    r["start_s"], say=lambda *_: None)
            prior = seen[0][0] if seen else 0.0
            rates = " ".join(f"{s / w * 1e12:.0f}" for _, w, s in seen)
            print(f"{a.trace.stem} {workload} {r['template']} {r['start_s']:.1f}: prior {prior * 1e12:.1f} | {rates}",
                  flush=True)
            if a.detail:
                print("   ", " ".join(f"{w:.3g}:{s * 1e3:.2f}ms" for _, w, s in seen))


if __name__ == "__main__":
    main()
