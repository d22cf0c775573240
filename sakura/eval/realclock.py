"""`sakura bench --clock real`: the same sweep through a real template server process, real sockets
and a link shaped by the trace in wall-clock time (slower: every edit takes its real latency)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura.eval.bench import (SYSTEMS, BenchConfig, TemplateBench, offset_plan, record, regime_block, regime_scale,
                               storage_of, summarize, workload_benches)
from sakura.net.client import RangeClient
from sakura.net.traces import Trace, load_trace
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server


def run_one_real(runtime: DeviceRuntime, tb: TemplateBench, req_index: int, system: str, trace: Trace, scale: float,
                 start: float) -> dict:
    """One edit on the real clock: the same session as the simulated sweep's, reading the template
    server through ``runtime`` (which shares the bench's calibration) over a link paced on the device."""
    session = runtime.session(tb.template, system, Network(trace, trace.name, start, scale))
    req = tb.request(req_index)
    outcome = session.run(req)
    return {**record(tb, req_index, system, start, outcome.timeline, outcome.image), "clock": "real"}


def run_bench_real(cfg: BenchConfig, out: Path, progress=None, say=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    base_trace = load_trace(cfg.trace)
    rng = np.random.default_rng(cfg.seed)
    summary: dict = {"config": {**{k: str(v) for k, v in cfg.__dict__.items()}, "clock": "real"}, "workloads": {}}
    with start_server(cfg.packs, port=0, process=True) as srv, RangeClient(srv.url) as client, \
            (out / "records.jsonl").open("w") as rec_file:
        for workload in cfg.workloads:
            tbs = workload_benches(workload, cfg, {}, say)
            scales = {tb.template.id: regime_scale(tb, base_trace, cfg.regime, cfg.trace_scale) for tb in tbs}
            runtimes = {tb.template.id: DeviceRuntime(client, calibration=tb.runtime.calibration) for tb in tbs}
            starts = rng.uniform(0, base_trace.duration, size=cfg.starts)
            records = []
            task = progress.add_task(f"bench {workload} (real clock)", total=cfg.starts * len(cfg.systems)) if progress else None
            for tb, req_index, start in offset_plan(tbs, starts):
                for system in cfg.systems:
                    r = run_one_real(runtimes[tb.template.id], tb, req_index, system, base_trace,
                                     scales[tb.template.id], start)
                    r["workload"] = workload
                    records.append(r)
                    rec_file.write(json.dumps(r) + "\n")
                    if progress:
                        progress.advance(task)
            ws = summarize(records, storage_of(tbs))
            ws["regime"] = regime_block(tbs, scales, base_trace, cfg.trace)
            for system, s in ws.items():
                if system in SYSTEMS:
                    s["device_peak_rss_bytes"] = None  # one shared process here: see the sim summary's model
            summary["workloads"][workload] = ws
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
