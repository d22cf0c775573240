"""One headline edit unit by unit on the simulated clock: SAKURA without and with the start-up flat-top rule
(`SakuraPolicy.flat_ratio`), and, given its record, the clairvoyant optimum's equal-latency schedule asked for
through the same runtime — each unit's level, bytes, the policy's byte allowance, request, arrival, rebuild and need
times (ms). What the link does between a unit's arrival and the next request shows here. (issue #32, session 24)

    python docs/results/issue32/policy4/timeline.py --workload fs --template fs-grace-hopper --request 0 \\
        --start 149.8 --trace ../shared/traces/5g-driving-236s.csv \\
        --calibration docs/results/issue32/headline/calibration.json [--packs DIR] [--records RECORDS]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "policy3"))

from one_session import edit_arguments, prepared, session_at  # noqa: E402
from replay_optimum import Scheduled  # noqa: E402

from sakura.eval import bench  # noqa: E402
from sakura.eval.bench import edit_input  # noqa: E402
from sakura.eval.plots import load_records  # noqa: E402
from sakura.online.policies import SakuraPolicy  # noqa: E402


def ms(t: float | None) -> str:
    return f"{1000 * t:5.0f}" if t is not None else "    -"


def main() -> None:
    ap = edit_arguments()
    ap.add_argument("--records", default=None)
    a = ap.parse_args()
    runs = [("SAKURA, paper's start (flat_ratio=None)", SakuraPolicy(flat_ratio=None)), ("SAKURA", None)]
    if a.records:
        rec = next(r for r in load_records(Path(a.records)) if r["system"] == "sakura" and r["template"] == a.template
                   and r["request"] == a.request and abs(r["start_s"] - a.start) < 0.05)
        runs.append(("the optimum's equal-latency schedule", Scheduled(rec["regret"]["equal_latency_actions"])))
    p, scaled = prepared(a)
    for name, policy in runs:
        report = session_at(p, scaled, a.start, policy).edit(edit_input(p, a.request), clock="sim",
                                                              timer=bench.REBUILD_CLOCKS["cpu"])
        tl = report.timeline
        print(f"\n{name}: {tl.latency_s:.3f} s, masked PSNR {report.quality['psnr_masked']:.2f} dB, stall "
              f"{tl.stall_s:.3f} s, {sum(u.nbytes for u in tl.units) / 1e6:.2f} MB")
        print(" unit  level       kB  allowance kB  request  arrival  rebuilt  needed")
        for u in tl.units:
            allowance = f"{u.budget_bytes / 1e3:12.0f}" if u.budget_bytes != float("inf") else f"{'-':>12}"
            print(f" {u.unit:4d}  {u.level.replace('rung ', '').split('/')[0]:>8} {u.nbytes / 1e3:6.0f} {allowance}"
                  f"    {ms(u.request_t)}    {ms(u.arrival_t)}    {ms(u.rebuild_done_t)}   {ms(u.needed_t)}")


if __name__ == "__main__":
    main()
