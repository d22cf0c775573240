"""One headline edit of SAKURA as the bench runs it, printing at every request what the plan predicts for one later
unit (its need, planned level and ready time, and those of a level named by ``--level``, with the rebuild times the
plan priced them at), then each unit's actual request, arrival, rebuild and need: which prediction moved, and when.

    python docs/results/issue32/policy16/predictions.py fs fs-grace-hopper 0 354.4601696116715 \\
        ../shared/traces/5g-walking-603s.csv --packs PACKS --calibration CALIBRATION --unit 5 --level r304 [--no-prior]

``--no-prior``: the device's rebuild rate starts at zero (free), as before the calibration timed rebuilds.
"""

import sys
from pathlib import Path

from sakura.eval import bench
from sakura.eval.bench import edit_input
from sakura.online import plan, policies
from sakura.runtime.session import Network

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policy15"))
from one_edit_slack import headline_edit  # noqa: E402  (the edit's arguments, its bench and scaled trace)


def main() -> None:
    def extra(ap):
        ap.add_argument("--unit", type=int, default=5)
        ap.add_argument("--level", default="r304", help="a level label's prefix")
        ap.add_argument("--no-prior", action="store_true")

    a, prepared, scaled = headline_edit(extra)
    choose = policies.SakuraPolicy.choose

    def printed(self, unit, now, deadline, monitor, horizon=None):
        d = choose(self, unit, now, deadline, monitor, horizon)
        if horizon is None:
            return d
        rebuild, rate_bps = self.rebuild_s(monitor), self.budget_rate_bps(monitor, horizon)
        line = (f"unit {unit.index:2d} at {now * 1e3:6.1f} ms asks {d.level.label:18s} stall {d.stall_s * 1e3:4.1f} | "
                f"rate {rate_bps / 1e6:6.1f} Mb/s, round trip {horizon.round_trip_s * 1e3:4.1f} ms, "
                f"{monitor.rebuild.s_per_work * 1e12:5.1f} ps/work")
        index = [u.index for u in horizon.units]
        if a.unit in index:
            j = index.index(a.unit)
            p = plan.plan_levels(horizon, rate_bps, rebuild)
            named = next(lv for lv in horizon.units[j].levels if lv.label.startswith(a.level))
            ready, _ = plan.ready_times(horizon, [*p.levels[:j], named, *p.levels[j + 1:]], rate_bps / 8, rebuild)
            line += (f" | unit {a.unit}: need {horizon.need_s[j] * 1e3:6.1f}, plan {p.levels[j].label:18s} ready "
                     f"{p.ready[j] * 1e3:6.1f} (rebuild {rebuild(p.levels[j]) * 1e3:4.1f}); {a.level} ready "
                     f"{ready[j] * 1e3:6.1f} (rebuild {rebuild(named) * 1e3:4.1f})")
        print(line)
        return d

    policies.SakuraPolicy.choose = printed
    session = prepared.session("sakura", Network(scaled, scaled.name, a.start, scale=1.0))
    if a.no_prior:
        session.rebuild_prior_s_per_work = 0.0
    tl = session.edit(edit_input(prepared, a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"],
                      with_reference=False).timeline
    ms = lambda t: "     -" if t is None else f"{t * 1e3:6.1f}"  # noqa: E731
    for u in tl.units:
        print(f"unit {u.unit:2d} {u.level:18s} {u.nbytes:7d} B: asked {ms(u.request_t)}, arrived {ms(u.arrival_t)}, "
              f"rebuilt {ms(u.rebuild_done_t)}, needed {ms(u.needed_t)} (predicted {ms(u.deadline_t)})")
    print(f"latency {tl.latency_s:.4f} s")


if __name__ == "__main__":
    main()
