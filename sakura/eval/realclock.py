"""`sakura bench --clock real|both`: the same sweep through a real template server process, real
sockets and a link shaped by the trace in wall-clock time (slower: every edit takes its real latency),
and the check of the simulated clock against the real one."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from sakura.eval.bench import BenchConfig, TemplateBench, edit_input, record, run_bench, simulated_edit
from sakura.eval.plots import load_records
from sakura.eval.round_trips import warm
from sakura.net.kernel import KernelLink, entered
from sakura.net.store_reader import link_for_server
from sakura.net.traces import Trace
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server
from sakura.systems import STREAMING


def run_one_real(runtime: DeviceRuntime, prepared: TemplateBench, req_index: int, system: str, trace: Trace,
                 scale: float, start: float, kernel: KernelLink | None = None) -> dict:
    """One edit on the real clock: the same session as the simulated sweep's, reading the template
    server through ``runtime`` (which shares the bench's calibration) over a link paced on the device — or,
    with ``kernel``, shaped by tc along the same scaled trace."""
    session = runtime.session(prepared.template, system, Network(trace, trace.name, start, scale, kernel=kernel))
    report = session.edit(edit_input(prepared, req_index))
    row = record(prepared, req_index, system, start, report)
    row = {**row, "clock": "real", "link": "paced" if kernel is None else "kernel",
           "outage_s": session.trace.dead_seconds(start, row["latency_s"])}
    if report.timeline.shards:  # what it executed, to replay the edit on the simulated clock at equal compute
        ran = session.compute.as_run(report.timeline)
        row["compute"] = {"prelude_s": ran.prelude_s, "shard_s": ran.shard_s}
    return row


def run_bench_real(cfg: BenchConfig, out: Path, progress=None, say=print, benches: dict | None = None,
                   kernel: KernelLink | None = None) -> dict:
    """The sweep of :func:`sakura.eval.bench.run_bench`, each edit run for real through a template server;
    with ``kernel``, the server and the device's sockets in its namespace, the link shaped by tc."""
    with contextlib.ExitStack() as stack:
        if kernel is not None:
            stack.enter_context(entered(kernel.ns))
        return _run_bench_real(cfg, out, progress, say, benches, kernel)


def _run_bench_real(cfg: BenchConfig, out: Path, progress, say, benches: dict | None,
                    kernel: KernelLink | None) -> dict:
    with start_server(cfg.packs, port=0, process=True) as srv, link_for_server(srv.url) as client:
        runtimes: dict[str, DeviceRuntime] = {}  # per template, sharing the bench's calibration

        def real_edit(prepared: TemplateBench, req_index: int, system: str, trace: Trace, scale: float,
                      start: float) -> dict:
            tid = prepared.template.id
            if tid not in runtimes:
                runtimes[tid] = DeviceRuntime(client, calibration=prepared.runtime.calibration)
                warm(client, tid)
            return run_one_real(runtimes[tid], prepared, req_index, system, trace, scale, start, kernel)

        return run_bench(cfg, out, progress, say, benches=benches, run_edit=real_edit,
                         clock="real" if kernel is None else "kernel")


def clock_check(sim_records: list[dict], real_records: list[dict]) -> dict:
    """Per workload and streaming system: p50 latency on each clock, their difference, and how often
    the two clocks chose the same level for the same fetch unit of the same edit."""
    def key(r):
        return r["workload"], *_edit_key(r)

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


def run_both_clocks(cfg: BenchConfig, out: Path, progress=None, say=print, kernel: KernelLink | None = None) -> dict:
    """The sweep on the simulated clock (``out``) and on the real one (``out/real``), same offsets,
    templates, requests and calibration; the simulated summary gains a ``clock_check`` table. With ``kernel``,
    a third run on the real clock over the kernel-shaped link (``out/kernel``) and a ``link_check`` table."""
    import json

    benches: dict = {}
    summary = run_bench(cfg, out, progress, say, benches=benches)
    run_bench_real(cfg, out / "real", progress, say, benches=benches)
    summary["clock_check"] = clock_check(load_records(out), load_records(out / "real"))
    if kernel is not None:
        run_bench_real(cfg, out / "kernel", progress, say, benches=benches, kernel=kernel)
        tcp = replace(cfg, sim_link="tcp", regret=False)  # the simulated clock with TCP's stall after an outage
        run_bench(tcp, out / "sim-tcp", progress, say, benches=benches)
        # the simulated clock with the testbed's compute: rebuilds take the executor's core (the second one serves
        # the template server, tc's replayer and the link's threads); on the paced link, and as the device reads
        # the kernel-shaped one
        for run, link in (("sim-host", "fluid"), ("sim-kernel", "kernel")):
            run_bench(replace(cfg, rebuild_overlap=0.0, sim_link=link, regret=False), out / run, progress, say,
                      benches=benches)
        replay_kernel_runs(cfg, out / "kernel", out / "sim-replay", progress, say, benches)
        summary["link_check"] = link_check({"sim": load_records(out), "sim-tcp": load_records(out / "sim-tcp"),
                                            "sim-host": load_records(out / "sim-host"),
                                            "sim-kernel": load_records(out / "sim-kernel"),
                                            "sim-replay": load_records(out / "sim-replay"),
                                            "paced": load_records(out / "real"),
                                            "kernel": load_records(out / "kernel")})
        (out / "links.md").write_text(link_table(summary["link_check"]) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def replay_kernel_runs(cfg: BenchConfig, kernel_run: Path, out: Path, progress=None, say=print,
                       benches: dict | None = None) -> dict:
    """Every edit of a kernel-link run replayed on the simulated clock with the compute that edit really did (its
    record's ``compute``) over the link as the device reads a kernel-shaped one: the two then differ by the link
    model alone."""
    measured = {_edit_key(r): r.get("compute") for r in load_records(kernel_run)}

    def replayed(prepared: TemplateBench, req_index: int, system: str, trace: Trace, scale: float, start: float):
        edit = {"template": prepared.template.id, "request": req_index, "system": system, "start_s": start}
        return simulated_edit(prepared, req_index, system, trace, scale, start, fallbacks=cfg.fallbacks, say=say,
                              sim_link="kernel", measured_compute=measured.get(_edit_key(edit)))

    return run_bench(replace(cfg, regret=False), out, progress, say, benches=benches, run_edit=replayed)


def _edit_key(r: dict) -> tuple:
    return r["template"], r["request"], r["system"], round(r["start_s"], 6)


# the simulated clock (the trace as it is; as TCP sees it through outages; with the host testbed's compute, on the
# paced link and as the device reads the kernel-shaped one; each kernel edit's own compute over that link), the
# device-paced link, the kernel-shaped one
LINK_RUNS = ("sim", "sim-tcp", "sim-host", "sim-kernel", "sim-replay", "paced", "kernel")


def link_check(runs: dict[str, list[dict]]) -> dict:
    """Per workload and system, for each run (``LINK_RUNS``) over the same edits: p50 / p90 latency, mean bytes,
    the share of fetch units at the simulated clock's level, the most chosen levels, and against the kernel-shaped
    run: its p90 over the kernel's, and the median per-edit latency ratio on the edits whose span on the kernel
    link held a dead stretch of the trace (``outage_s``)."""
    def key(r):
        return r["workload"], *_edit_key(r)

    sim = {key(r): r for r in runs.get("sim", [])}
    kernel = {key(r): r for r in runs.get("kernel", [])}
    out: dict = {}
    for run, records in runs.items():
        for r in records:
            row = out.setdefault(r["workload"], {}).setdefault(r["system"], {}).setdefault(
                run, {"latency": [], "bytes": [], "levels": {}, "same": 0, "units": 0, "trough": []})
            row["latency"].append(r["latency_s"])
            row["bytes"].append(r["bytes"])
            for lv in r.get("levels") or []:
                row["levels"][lv or "-"] = row["levels"].get(lv or "-", 0) + 1
            other = sim.get(key(r))
            if other is not None:
                row["same"] += sum(a == b for a, b in zip(r["levels"], other["levels"]))
                row["units"] += len(r["levels"])
            k = kernel.get(key(r))
            if k is not None and k.get("outage_s", 0.0) > 0:
                row["trough"].append(r["latency_s"] / k["latency_s"])
    for systems in out.values():
        for runs_of in systems.values():
            for run, row in runs_of.items():
                top = sorted(row["levels"].items(), key=lambda kv: -kv[1])[:3]
                runs_of[run] = {"edits": len(row["latency"]), "p50_s": float(np.median(row["latency"])),
                                "p90_s": float(np.percentile(row["latency"], 90)),
                                "bytes_mean": float(np.mean(row["bytes"])),
                                "same_level_as_sim": row["same"] / row["units"] if row["units"] else None,
                                "top_levels": [f"{lv} ×{n}" for lv, n in top],
                                "trough_edits": len(row["trough"]),
                                "trough_ratio_to_kernel": float(np.median(row["trough"])) if row["trough"] else None}
            k90 = runs_of.get("kernel", {}).get("p90_s")
            for c in runs_of.values():
                c["p90_ratio_to_kernel"] = c["p90_s"] / k90 if k90 else None
    return out


def link_table(check: dict) -> str:
    """The three-link check as one markdown table."""
    lines = ["| workload | system | run | edits | p50 (s) | p90 (s) | p90 / kernel's | on trough edits / kernel "
             "(edits) | MB | same level as sim | most chosen levels |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for workload, systems in check.items():
        for name, runs_of in systems.items():
            for run in LINK_RUNS:
                c = runs_of.get(run)
                if c is None:
                    continue
                same = "—" if c["same_level_as_sim"] is None else f"{100 * c['same_level_as_sim']:.0f}%"
                p90k = "—" if c.get("p90_ratio_to_kernel") is None else f"{c['p90_ratio_to_kernel']:.2f}"
                trough = ("—" if c.get("trough_ratio_to_kernel") is None
                          else f"{c['trough_ratio_to_kernel']:.2f} ({c['trough_edits']})")
                lines.append(f"| {workload} | {name} | {run} | {c['edits']} | {c['p50_s']:.3f} | {c['p90_s']:.3f} "
                             f"| {p90k} | {trough} | {c['bytes_mean'] / 1e6:.2f} | {same} | "
                             f"{', '.join(c['top_levels'])} |")
    return "\n".join(lines)


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
