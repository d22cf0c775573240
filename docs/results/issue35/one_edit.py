"""One bench edit, rerun and printed unit by unit: on the simulated clock with the host's compute, then on the
device-paced and the kernel-shaped link (root), twice each — how the kernel link's tail edits were read.

    python docs/results/issue35/one_edit.py --workload fs --template fs-astronaut --request 2 --start 490.40 \
        --trace ../shared/traces/5g-walking-603s.csv --calibration CALIBRATION [--packs DIR] [--system sakura]

(workload, template, request and start from a record of the sweep: `load_records(…/kernel-records.jsonl.gz)`.)
"""

import argparse
from pathlib import Path

import torch

from sakura.eval import bench
from sakura.eval.bench import BenchConfig, edit_input, regime_scales, workload_benches
from sakura.eval.round_trips import warm
from sakura.net.kernel import entered, kernel_link
from sakura.net.store_reader import link_for_server
from sakura.net.traces import load_trace
from sakura.places import default_packs
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server


def show(name: str, tl) -> None:
    print(f"== {name}: latency {tl.latency_s:.3f} s, fallbacks {tl.fallbacks}")
    for u in tl.units:
        arr = "-" if u.arrival_t is None else f"{u.arrival_t:.3f}"
        print(f"  unit {u.unit:2d} shard {u.needed_by:2d} {u.level or '-':22s} {u.nbytes / 1e3:7.1f} kB  request "
              f"{u.request_t:.3f}  through {arr}  needed {u.needed_t:.3f}  R̂ {u.rate_mbps:5.2f}"
              f"{'  dropped' if u.dropped else ''}{'  asked ' + u.requested_level if u.requested_level else ''}")
    ran = [s for s in tl.shards if s.exec_end_t is not None]
    if ran:
        busy = sum(s.exec_end_t - s.exec_start_t for s in ran)
        print(f"  prelude {ran[0].exec_start_t - ran[0].stall_s:.3f} s, execution {busy:.3f} s, "
              f"stall {sum(s.stall_s for s in tl.shards):.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("workload", "template", "trace", "calibration"):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--request", type=int, required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--system", default="sakura")
    ap.add_argument("--packs", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    packs = Path(a.packs) if a.packs else default_packs()
    cfg = BenchConfig(workloads=(a.workload,), systems=(a.system,), trace=a.trace, packs=packs,
                      calibration_file=Path(a.calibration))
    prepared = {p.template.id: p for p in workload_benches(a.workload, cfg, {}, print)}
    base = load_trace(a.trace)
    scale = regime_scales(list(prepared.values()), base, cfg)[a.template]
    p = prepared[a.template]
    scaled = base.scaled(scale)
    session = p.session(a.system, Network(scaled, scaled.name, a.start, scale=1.0))
    report = session.edit(edit_input(p, a.request), clock="sim", timer=bench.REBUILD_CLOCKS["cpu"],
                          rebuild_overlap=0.0, unpaced=True, with_reference=False)
    show("sim-kernel", report.timeline)
    with kernel_link() as kl, entered(kl.ns), start_server(packs, port=0, process=True) as srv, \
            link_for_server(srv.url) as client:
        runtime = DeviceRuntime(client, calibration=p.runtime.calibration)
        warm(client, a.template)
        for kernel in (None, kl, None, kl):
            session = runtime.session(p.template, a.system, Network(base, base.name, a.start, scale, kernel=kernel))
            show("kernel" if kernel else "paced", session.edit(edit_input(p, a.request), with_reference=False).timeline)


if __name__ == "__main__":
    main()
