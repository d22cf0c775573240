"""`sakura bench --clock real|both`: the same sweep through a real template server process, real
sockets and a link shaped by the trace in wall-clock time (slower: every edit takes its real latency),
and the check of the simulated clock against the real one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sakura.eval.bench import BenchConfig, TemplateBench, edit_input, record, run_bench
from sakura.eval.plots import load_records
from sakura.eval.round_trips import warm
from sakura.net.store_reader import link_for_server
from sakura.net.traces import Trace
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server
from sakura.systems import STREAMING


def run_one_real(runtime: DeviceRuntime, prepared: TemplateBench, req_index: int, system: str, trace: Trace,
                 scale: float, start: float) -> dict:
    """One edit on the real clock: the same session as the simulated sweep's, reading the template
    server through ``runtime`` (which shares the bench's calibration) over a link paced on the device."""
    session = runtime.session(prepared.template, system, Network(trace, trace.name, start, scale))
    report = session.edit(edit_input(prepared, req_index))
    return {**record(prepared, req_index, system, start, report), "clock": "real"}


def run_bench_real(cfg: BenchConfig, out: Path, progress=None, say=print, benches: dict | None = None) -> dict:
    """The sweep of :func:`sakura.eval.bench.run_bench`, each edit run for real through a template server."""
    with start_server(cfg.packs, port=0, process=True) as srv, link_for_server(srv.url) as client:
        runtimes: dict[str, DeviceRuntime] = {}  # per template, sharing the bench's calibration

        def real_edit(prepared: TemplateBench, req_index: int, system: str, trace: Trace, scale: float,
                      start: float) -> dict:
            tid = prepared.template.id
            if tid not in runtimes:
                runtimes[tid] = DeviceRuntime(client, calibration=prepared.runtime.calibration)
                warm(client, tid)
            return run_one_real(runtimes[tid], prepared, req_index, system, trace, scale, start)

        return run_bench(cfg, out, progress, say, benches=benches, run_edit=real_edit, clock="real")


def clock_check(sim_records: list[dict], real_records: list[dict]) -> dict:
    """Per workload and streaming system: p50 latency on each clock, their difference, and how often
    the two clocks chose the same level for the same fetch unit of the same edit."""
    def key(r):
        return r["workload"], r["template"], r["request"], r["system"], round(r["start_s"], 6)

    real = {key(r): r for r in real_records}
    out: dict = {}
    for r in sim_records:
        if r["system"] not in STREAMING or key(r) not in real:
            continue
        row = out.setdefault(r["workload"], {}).setdefault(r["system"], {"sim": [], "real": [], "same": 0,
                                                                         "units": 0})
        rr = real[key(r)]
        row["sim"].append(r["latency_s"])
        row["real"].append(rr["latency_s"])
        row["same"] += sum(a == b for a, b in zip(r["levels"], rr["levels"]))
        row["units"] += len(r["levels"])
    for systems in out.values():
        for name, row in systems.items():
            sim, real_ = float(np.median(row.pop("sim"))), float(np.median(row.pop("real")))
            systems[name] = {"p50_sim_s": sim, "p50_real_s": real_, "diff": (sim - real_) / real_,
                             "same_level_share": row["same"] / max(1, row["units"])}
    return out


def run_both_clocks(cfg: BenchConfig, out: Path, progress=None, say=print) -> dict:
    """The sweep on the simulated clock (``out``) and on the real one (``out/real``), same offsets,
    templates, requests and calibration; the simulated summary gains a ``clock_check`` table."""
    import json

    benches: dict = {}
    summary = run_bench(cfg, out, progress, say, benches=benches)
    run_bench_real(cfg, out / "real", progress, say, benches=benches)
    summary["clock_check"] = clock_check(load_records(out), load_records(out / "real"))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def clock_table(check: dict) -> str:
    """The clock check as a markdown table."""
    lines = [
        "| workload | system | p50 sim (s) | p50 real (s) | sim − real | same level |",
        "|---|---|---|---|---|---|",
    ]
    for workload, systems in check.items():
        for name, c in systems.items():
            lines.append(
                f"| {workload} | {name} | {c['p50_sim_s']:.3f} | {c['p50_real_s']:.3f} | {100 * c['diff']:+.1f}% "
                f"| {100 * c['same_level_share']:.0f}% |"
            )
    return "\n".join(lines)
