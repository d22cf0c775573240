"""One headline edit of SAKURA on the simulated clock as the bench runs it, printing at every request the unit, the
stall budget left, the level asked for and the stall planned for it: where an edit's stall budget went.

    python docs/results/issue32/policy15/stalls.py fs fs-grace-hopper 0 354.4601696116715 \
        ../shared/traces/5g-walking-603s.csv --packs PACKS --calibration docs/results/issue32/headline/calibration.json
"""

import sys
from pathlib import Path

from sakura.eval import bench
from sakura.eval.bench import edit_input
from sakura.online import policies
from sakura.runtime.session import Network

sys.path.insert(0, str(Path(__file__).resolve().parent))
from one_edit_slack import headline_edit  # noqa: E402  (the edit's arguments, its bench and scaled trace)


def main() -> None:
    a, prepared, scaled = headline_edit()
    choose = policies.SakuraPolicy.choose

    def printed(self, unit, now, deadline, monitor, horizon=None):
        d = choose(self, unit, now, deadline, monitor, horizon)
        if horizon is not None:
            print(f"unit {unit.index:2d} at {now * 1e3:6.1f} ms: budget left {horizon.stall_budget_s * 1e3:4.1f} ms, "
                  f"asks {d.level.label:22s} stall {d.stall_s * 1e3:4.1f} ms")
        return d

    policies.SakuraPolicy.choose = printed
    session = prepared.session("sakura", Network(scaled, scaled.name, a.start, scale=1.0))
    report = session.edit(edit_input(prepared, a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"],
                          with_reference=False)
    print(f"latency {report.timeline.latency_s:.4f} s")


if __name__ == "__main__":
    main()
