"""One headline edit of SAKURA, its delivered schedule replayed (the cache assembled from the stored bytes each unit
received, `sakura.eval.regret.replay_output`) and measured: as delivered, with the given shards reused from the
previous step instead, and with each unit alone moved to the level the equal-latency optimum gave it — which units
the quality gap is in, and what a reuse would have bought.

    python docs/results/issue32/headline/replay_edit.py TRACE WORKLOAD TEMPLATE START --reuse 7 \
        --packs PACKS --calibration docs/results/issue32/headline/calibration.json
"""

import argparse
from pathlib import Path

import torch

from sakura.eval.bench import BenchConfig, regime_scales, workload_benches
from sakura.eval.plan_model import REUSE, STREAM, Schedule, ShardAction
from sakura.eval.plots import load_records
from sakura.eval.regret import format_inputs, plan_problem, replay_output
from sakura.net.traces import load_trace
from sakura.runtime.session import Network

HEADLINE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace", help="a trace folder of the headline, e.g. 4g5g-mixed-600s")
    ap.add_argument("workload")
    ap.add_argument("template")
    ap.add_argument("start", type=float, help="the record's start_s (to 0.01 s)")
    ap.add_argument("--reuse", default="", help="shards to reuse from the previous step, comma-separated")
    ap.add_argument("--packs", type=Path, required=True)
    ap.add_argument("--calibration", type=Path, required=True)
    ap.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    rec = next(r for r in load_records(HEADLINE / a.trace / "records.jsonl.gz")
               if r["system"] == "sakura" and r["template"] == a.template and abs(r["start_s"] - a.start) < 0.01)
    trace = a.traces / f"{a.trace}.csv"
    cfg = BenchConfig(workloads=(a.workload,), systems=("sakura",), trace=str(trace), packs=a.packs,
                      calibration_file=a.calibration)
    prepared = {p.template.id: p for p in workload_benches(a.workload, cfg, {}, lambda *_: None)}
    base = load_trace(str(trace))
    p = prepared[a.template]
    scaled = base.scaled(regime_scales(list(prepared.values()), base, cfg)[a.template])
    session = p.session("sakura", Network(scaled, scaled.name, rec["start_s"], scale=1.0))
    req = session.request(catalog_request=p.template.eval_requests[rec["request"]])
    problem = plan_problem(session, format_inputs(p, "sakura", lambda *_: None))

    def psnr(levels: list[str], reuse: set[int]) -> float:
        actions = [ShardAction(REUSE) if j in reuse else ShardAction(STREAM, (label,)) for j, label in enumerate(levels)]
        image = replay_output(session, req, problem, Schedule(actions, 0.0, 0.0))
        return float(session.quality(image, req, rec["request"])["psnr_masked"])

    reuse = {int(j) for j in a.reuse.split(",") if j}
    print(f"recorded {rec['psnr_masked']:.2f} dB (fallbacks {rec['fallbacks']}, cuts {rec['cuts']}); "
          f"the equal-latency optimum {rec['regret']['optimal_psnr_masked']:.2f} dB")
    print(f"replayed as delivered: {psnr(rec['levels'], set()):.2f} dB")
    if reuse:
        print(f"shards {sorted(reuse)} reused instead: {psnr(rec['levels'], reuse):.2f} dB")
    for j, (own, best) in enumerate(zip(rec["levels"], rec["regret"]["equal_latency_actions"])):
        if own != best and best not in (REUSE, "recompute", "local"):
            levels = list(rec["levels"])
            levels[j] = best
            print(f"  unit {j} alone {own} -> {best}: {psnr(levels, set()):.2f} dB")


if __name__ == "__main__":
    main()
