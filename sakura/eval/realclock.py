"""`sakura bench --clock real`: the same sweep through a real template server process, real sockets
and a link shaped by the trace in wall-clock time (slower: every edit takes its real latency)."""

from __future__ import annotations

from pathlib import Path

from sakura.eval.bench import BenchConfig, TemplateBench, record, run_bench
from sakura.net.client import RangeClient
from sakura.net.traces import Trace
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server


def run_one_real(runtime: DeviceRuntime, prepared: TemplateBench, req_index: int, system: str, trace: Trace,
                 scale: float, start: float) -> dict:
    """One edit on the real clock: the same session as the simulated sweep's, reading the template
    server through ``runtime`` (which shares the bench's calibration) over a link paced on the device."""
    session = runtime.session(prepared.template, system, Network(trace, trace.name, start, scale))
    req = prepared.request(req_index)
    outcome = session.run(req)
    return {**record(prepared, req_index, system, start, outcome.timeline, outcome.image), "clock": "real"}


def run_bench_real(cfg: BenchConfig, out: Path, progress=None, say=print) -> dict:
    """The sweep of :func:`sakura.eval.bench.run_bench`, each edit run for real through a template server."""
    with start_server(cfg.packs, port=0, process=True) as srv, RangeClient(srv.url) as client:
        runtimes: dict[str, DeviceRuntime] = {}  # per template, sharing the bench's calibration

        def real_edit(prepared: TemplateBench, req_index: int, system: str, trace: Trace, scale: float,
                      start: float) -> dict:
            tid = prepared.template.id
            if tid not in runtimes:
                runtimes[tid] = DeviceRuntime(client, calibration=prepared.runtime.calibration)
            runtime = runtimes[tid]
            return run_one_real(runtime, prepared, req_index, system, trace, scale, start)

        return run_bench(cfg, out, progress, say, run_edit=real_edit, clock="real")
