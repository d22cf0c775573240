"""`sakura loadtest`: N devices streaming edits at once against template-server replicas and the pack store.

Each client is one device doing streamed edits the way the runtime fetches: the catalog and headers from a
template server (replicas taken in turn, as a load balancer would), presigned URLs, then the SAKURA pack's
fetch units in order — levels chosen by the real SAKURA policy and monitor, ranges from the real encoding,
one HTTP Range request per range, paced on the device side by a :class:`~sakura.net.paced.PacedLink` along
the trace. Compute is simulated: shard k executes for ``shard_s`` once its cache arrived and shard k−1 is
done, and at most :data:`AHEAD` shards are fetched ahead of execution (the runtime's bounded buffers).

The clients run as threads of one process, or of ``--procs P`` processes (client ``i`` in process ``i % P``,
all started at one moment) so that the generator is not the bottleneck; results are pooled the same way.
Reported: time-to-shard (a shard's request → its last byte, p50/p99), stall (time execution waited for
bytes), errors, edits, and aggregate payload throughput.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import typer

from sakura.cli.errors import UserError
from sakura.formats import encoding_from_header, file_id
from sakura.net.kernel import check_link, entered, link_for_command
from sakura.net.paced import PacedLink
from sakura.net.store_reader import ServerStoreClient, link_for_server
from sakura.net.traces import load_trace
from sakura.net.unpaced import UnpacedLink
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import RULE_SETTINGS, get_policy

AHEAD = 2  # shards fetched ahead of the executing one (the runtime's bound on device cache memory)


@dataclass
class LoadConfig:
    servers: list[str]
    clients: int = 32
    edits: int = 2  # per client
    trace: str = "5g"
    trace_scale: float = 1.0
    shard_s: float = 0.02  # simulated compute per shard
    prelude_s: float = 0.05  # simulated compute before the first shard (text / reference encoding)
    seed: int = 0
    # "kernel": servers and devices share a namespace's loopback, shaped by tc along the trace × clients (one cell's
    # link, shared by its devices) from monotonic time ``link_t0``; the devices do not pace
    link: str = "paced"
    link_t0: float = 0.0


@dataclass
class ClientResult:
    time_to_shard: list[float] = field(default_factory=list)
    stall_s: list[float] = field(default_factory=list)
    edit_s: list[float] = field(default_factory=list)
    nbytes: int = 0
    errors: list[str] = field(default_factory=list)
    pid: int = field(default_factory=os.getpid)  # the generator process that ran the client


def one_edit(
    client: ServerStoreClient, template_id: str, trace, start: float, cfg: LoadConfig, out: ClientResult
) -> None:
    """The fetch pattern of one streamed SAKURA edit, compute simulated (see the module docstring)."""
    fid = file_id(template_id, "sakura")
    enc = encoding_from_header("sakura", client.header_bytes(fid)).fresh()
    units = enc.units
    initial_bps = float(trace.rate_at(start)) * 1e6
    # (the per-unit window rule: one fetch per unit in turn has no scheduler's horizon to plan the rest with)
    policy, monitor = get_policy("sakura", **RULE_SETTINGS), RuntimeMonitor(initial_bps)
    policy.begin(units, cfg.prelude_s + cfg.shard_s * len(units), initial_bps)
    kernel = cfg.link == "kernel"
    link = UnpacedLink(client) if kernel else PacedLink(client, trace, start)
    t0 = time.monotonic()
    exec_start: list[float] = []
    exec_end = t0 + cfg.prelude_s
    for unit in units:
        k = unit.needed_by
        if k > AHEAD:  # bounded buffer: room for shard k once shard k - AHEAD - 1 is executing
            time.sleep(max(0.0, exec_start[k - AHEAD - 1] - time.monotonic()))
        unit = enc.priced(unit)
        deadline = t0 + cfg.prelude_s + cfg.shard_s * k
        decision = policy.choose(unit, time.monotonic(), deadline, monitor)
        pending = link.send(fid, enc.ranges(unit, decision.level))
        if not kernel:
            time.sleep(max(0.0, pending.done - time.monotonic()))  # one sleep, not the receive loop's polls
        tr = link.receive(pending)
        monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
        out.time_to_shard.append(tr.t_last_byte - tr.t_request)
        out.nbytes += tr.nbytes
        begin = max(tr.t_last_byte, exec_end)
        out.stall_s.append(max(0.0, tr.t_last_byte - exec_end))
        exec_start.append(begin)
        exec_end = begin + cfg.shard_s
    time.sleep(max(0.0, exec_end - time.monotonic()))
    out.edit_s.append(exec_end - t0)
    link.close()


def run_client(
    index: int, cfg: LoadConfig, templates: list[str], barrier: threading.Barrier, out: ClientResult
) -> None:
    rng = random.Random(cfg.seed * 100003 + index)
    trace = load_trace(cfg.trace).scaled(cfg.trace_scale)
    barrier.wait()
    for e in range(cfg.edits):
        server = cfg.servers[(index + e) % len(cfg.servers)]  # round robin: the load balancer
        start = rng.uniform(0.0, trace.duration)
        if cfg.link == "kernel":  # where the shared, tc-shaped trace is now
            start = (time.monotonic() - cfg.link_t0) % trace.duration
        try:
            # a fresh device each edit: catalog + headers + URLs again (on a kernel link: bytes from a pack folder's
            # server, the store's endpoint being outside the namespace)
            with (link_for_server(server) if cfg.link == "kernel" else ServerStoreClient(server)) as client:
                one_edit(client, templates[(index + e) % len(templates)], trace, start, cfg, out)
        except Exception as e:  # noqa: BLE001 - counted and reported, the load goes on
            out.errors.append(f"{type(e).__name__}{_where(e)}: {e}"[:240])


def _where(e: Exception) -> str:
    """' (GET host:port/path)' for an HTTP client error: which server (template server or store) failed."""
    try:
        r = e.request  # httpx errors; raises when the error has no request
        return f" ({r.method} {r.url.host}:{r.url.port}{r.url.path})"
    except (AttributeError, RuntimeError):
        return ""


def run_load(cfg: LoadConfig, procs: int = 1) -> dict:
    """Run ``cfg.clients`` clients as threads of ``procs`` processes (client ``i`` in process ``i % procs``), so
    that the generator itself is not what saturates first; every process starts its clients at the same moment."""
    with (link_for_server(cfg.servers[0]) if cfg.link == "kernel" else ServerStoreClient(cfg.servers[0])) as probe:
        # (a store's server names each file's template; a pack folder's lists file ids: a template's pack is its id)
        listed = probe.templates()
        templates = sorted({t["template"] for t in listed if t["id"] == t["template"]} if cfg.link != "kernel"
                           else {t["id"] for t in listed if "." not in t["id"]})
    if not templates:
        raise RuntimeError(f"the store behind {cfg.servers[0]} has no published templates (run sakura build)")
    procs = max(1, min(int(procs), cfg.clients))
    if procs == 1:
        results, wall = run_clients(list(range(cfg.clients)), cfg, templates)
    else:
        results, wall = _run_in_processes(cfg, templates, procs)
    return {**summarize(cfg, results, wall, templates), "procs": procs}


def run_clients(indices: list[int], cfg: LoadConfig, templates: list[str],
                ready=lambda: None) -> tuple[list[ClientResult], float]:
    """Clients ``indices`` as threads of this process; ``ready()`` is called once they all wait at the start
    line, and they go when it returns. Returns their results and the wall time from the start."""
    results = [ClientResult() for _ in indices]
    barrier = threading.Barrier(len(indices) + 1)
    threads = [threading.Thread(target=run_client, args=(i, cfg, templates, barrier, r), daemon=True)
               for i, r in zip(indices, results)]
    for t in threads:
        t.start()
    ready()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


START_TIMEOUT_S = 120.0  # a generator process that is not at the start line by then has failed


def _process_main(k: int, procs: int, cfg: LoadConfig, templates: list[str], start, out) -> None:
    """One generator process: its share of the clients, started together with the other processes'."""
    try:
        results, _ = run_clients(list(range(k, cfg.clients, procs)), cfg, templates,
                                 ready=lambda: start.wait(START_TIMEOUT_S))
        out.put((k, results, None))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        start.abort()
        out.put((k, [], f"{type(e).__name__}: {e}"[:200]))


def _run_in_processes(cfg: LoadConfig, templates: list[str], procs: int) -> tuple[list[ClientResult], float]:
    import multiprocessing as mp
    import queue as queue_mod
    from threading import BrokenBarrierError

    ctx = mp.get_context("spawn")  # no fork of a process holding threads and open connections
    start, out = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=_process_main, args=(k, procs, cfg, templates, start, out), daemon=True,
                           name=f"sakura-load-{k}") for k in range(procs)]
    for w in workers:
        w.start()
    try:
        try:
            start.wait(START_TIMEOUT_S)
        except BrokenBarrierError:
            raise RuntimeError("a load-generator process did not reach the start line: "
                               + _first_failure(out, queue_mod)) from None
        t0 = time.monotonic()
        results: list[ClientResult] = []
        for _ in workers:
            while True:
                try:
                    _, got, failure = out.get(timeout=5.0)
                    break
                except queue_mod.Empty:
                    if not any(w.is_alive() for w in workers):
                        raise RuntimeError("the load-generator processes ended without reporting") from None
            if failure:
                raise RuntimeError(f"a load-generator process failed: {failure}")
            results += got
        return results, time.monotonic() - t0
    finally:
        for w in workers:
            w.join(5.0)
            if w.is_alive():
                w.terminate()


def _first_failure(out, queue_mod) -> str:
    try:
        return out.get(timeout=2.0)[2] or "no reason given"
    except queue_mod.Empty:
        return "it did not say why (timed out starting)"


def summarize(cfg: LoadConfig, results: list[ClientResult], wall: float, templates: list[str]) -> dict:
    tts = (
        np.array([x for r in results for x in r.time_to_shard])
        if any(r.time_to_shard for r in results)
        else np.zeros(1)
    )
    stall = [sum(r.stall_s) for r in results]
    errors = [e for r in results for e in r.errors]
    nbytes = sum(r.nbytes for r in results)
    edits = sum(len(r.edit_s) for r in results)
    return {"clients": cfg.clients, "servers": len(cfg.servers), "edits": edits, "errors": len(errors),
            "error_samples": errors[:3], "templates": templates, "trace": cfg.trace, "trace_scale": cfg.trace_scale,
            "shards": int(sum(len(r.time_to_shard) for r in results)),
            "time_to_shard_p50_s": round(float(np.percentile(tts, 50)), 4),
            "time_to_shard_p99_s": round(float(np.percentile(tts, 99)), 4),
            "edit_s_p50": round(float(np.median([x for r in results for x in r.edit_s] or [0])), 3),
            "stall_s_mean": round(float(np.mean(stall)), 4), "wall_s": round(wall, 2), "mbytes": round(nbytes / 1e6, 1),
            "throughput_mb_s": round(nbytes / 1e6 / wall, 1), "edits_per_s": round(edits / wall, 2),
            "generator_processes": len({r.pid for r in results})}


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process has used (Linux /proc; None elsewhere)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def loadtest_cmd(
    clients: int = typer.Option(32, "--clients", help="Concurrent devices."),
    server: Optional[str] = typer.Option(None, "--server", help="Template server URL(s), comma-separated; default: "
                                         "start --replicas servers on --store."),
    store: Optional[str] = typer.Option(None, "--store", help="Pack store URL (s3://bucket/prefix) to serve."),
    replicas: int = typer.Option(2, "--replicas", help="Template servers to start on --store."),
    procs: int = typer.Option(1, "--procs", help="Processes the clients are spread over (threads in each)."),
    edits: int = typer.Option(2, "--edits", help="Edits per client."),
    trace: str = typer.Option("5g", "--trace", help="Each device's link: 5g, 4g5g, wifi, fixed:MBPS or a file."),
    trace_scale: float = typer.Option(1.0, "--trace-scale"),
    shard_ms: float = typer.Option(20.0, "--shard-ms", help="Simulated compute per shard (ms)."),
    as_json: bool = typer.Option(False, "--json"),
    link: str = typer.Option("paced", "--link", help="paced (each device paces its own link) or kernel (servers and "
                             "devices in a network namespace whose loopback tc shapes along the trace × clients: one "
                             "shared cell; --store is then a pack folder; root)."),
):
    """Load test: N devices' streamed-edit fetches against template-server replicas and the pack store."""
    from sakura.server.run import start_server  # fastapi/uvicorn: sakura --help stays light

    if not server and not store:
        raise UserError("pass --server URL[,URL...] or --store s3://bucket/prefix")
    if clients < 1 or replicas < 1 or edits < 1 or procs < 1:
        raise UserError("--clients, --replicas, --edits and --procs must be at least 1")
    check_link(link)
    if link == "kernel" and (server or "://" in str(store)):
        raise UserError("--link kernel starts its servers inside the namespace on a pack folder: pass --store FOLDER, "
                        "no --server")
    with link_for_command(link) as kernel, ExitStack() as stack:
        cfg = LoadConfig([], clients, edits, trace, trace_scale, shard_ms / 1e3, link=link)
        if kernel is not None:
            stack.enter_context(entered(kernel.ns))
        started = [] if server else [stack.enter_context(start_server(store, port=0, process=True))
                                     for _ in range(replicas)]
        cfg.servers = server.split(",") if server else [s.url for s in started]
        pids = [s._proc.pid for s in started if s._proc is not None]
        cpu0 = [cpu_seconds(p) for p in pids]
        if kernel is not None:  # the cell's link: every device's trace at once
            replay = stack.enter_context(kernel.replaying(load_trace(trace).scaled(trace_scale * clients), 0.0))
            cfg.link_t0 = replay.t0
        summary = run_load(cfg, procs)
        summary["link"] = link
        cpu1 = [cpu_seconds(p) for p in pids]
        if pids and None not in cpu0 + cpu1:  # the servers' own work: they never carry pack bytes
            summary["server_cpu_s"] = [round(b - a, 2) for a, b in zip(cpu0, cpu1)]
    if as_json:
        typer.echo(json.dumps(summary, indent=1))
        return
    typer.echo(f"{summary['clients']} clients × {edits} edits in {summary['procs']} process(es) on "
               f"{summary['servers']} server(s): "
               f"{summary['edits']} edits, {summary['errors']} errors; time-to-shard p50 "
               f"{summary['time_to_shard_p50_s'] * 1e3:.1f} ms, p99 {summary['time_to_shard_p99_s'] * 1e3:.1f} ms; "
               f"{summary['throughput_mb_s']} MB/s aggregate ({summary['mbytes']} MB in {summary['wall_s']} s)")
    if "server_cpu_s" in summary:
        typer.echo(f"template servers used {summary['server_cpu_s']} CPU seconds")
    for e in summary["error_samples"]:
        typer.echo(f"  error: {e}")
