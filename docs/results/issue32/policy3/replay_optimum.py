"""The clairvoyant optimum's equal-latency schedule of one headline edit (its record's `equal_latency_actions`),
asked for level by level through the runtime on the simulated clock, beside SAKURA's own run of the same edit:
does the optimum's trade hold on the runtime's clock, not only in the planner's model? (issue #32, session 23)

    python docs/results/issue32/policy3/replay_optimum.py --workload vton --template vton-grace-hopper \\
        --request 2 --start 415.1 --trace ../shared/traces/4g5g-mixed-600s.csv \\
        --records docs/results/issue32/headline/session21/4g5g-mixed-600s/records.jsonl.gz \\
        --calibration docs/results/issue32/headline/calibration.json [--packs DIR]
"""

from pathlib import Path

from one_session import edit_arguments, prepared, session_at

from sakura.eval import bench
from sakura.eval.bench import edit_input
from sakura.eval.plots import load_records
from sakura.online.policies import Decision, Policy


class Scheduled(Policy):
    """Asks for the level a schedule names for each shard."""

    name = "scheduled"

    def __init__(self, labels: list[str]):
        self.labels = labels

    def choose(self, unit, now, deadline, monitor):
        level = next(lv for lv in unit.levels if lv.label == self.labels[unit.needed_by])
        return Decision(level, monitor.rate_bps, deadline - now, float("inf"), True)


def main() -> None:
    a = edit_arguments("records").parse_args()
    rec = next(r for r in load_records(Path(a.records)) if r["system"] == "sakura" and r["template"] == a.template
               and r["request"] == a.request and abs(r["start_s"] - a.start) < 0.05)
    g = rec["regret"]
    print(f"record: {rec['latency_s']:.3f} s, {rec['psnr_masked']:.2f} dB; the optimum at equal latency "
          f"{g['optimal_psnr_masked']:.2f} dB (planner's model)")
    p, scaled = prepared(a)
    for name, policy in (("SAKURA", None), ("the optimum's schedule", Scheduled(g["equal_latency_actions"]))):
        session = session_at(p, scaled, rec["start_s"], policy)
        report = session.edit(edit_input(p, a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"])
        tl = report.timeline
        print(f"{name}: {tl.latency_s:.3f} s, masked PSNR {report.quality['psnr_masked']:.2f} dB, stall "
              f"{tl.stall_s:.3f} s, fallbacks {tl.fallbacks or 'none'}")
        print("   " + " ".join(u.level.split("/")[0] for u in tl.units))


if __name__ == "__main__":
    main()
