"""#35 item 3: how SAKURA's rate estimate tracks a kernel-shaped link across a trough.

A template server and the device's fetch loop in a sakura network namespace whose loopback tc shapes along a step
trace (10 Mbit/s, a trough of 0 Mbit/s — tbf at the floor rate —, 10 Mbit/s again). The device side is the runtime's
own pieces: the SAKURA policy chooses each fetch unit's level from the RuntimeMonitor's estimate, the UnpacedLink
fetches it; compute is simulated (``--shard-s`` per shard, like `sakura loadtest`) so that the edit spans the trough.
A sampler reads the server socket's TCP state (``ss -tin``: bytes in flight = bytes_sent − bytes_acked, cwnd) every
10 ms. Writes a JSON of everything and a plot.

    sudo .venv/bin/python docs/results/issue35/estimator_trough.py --out docs/results/issue35/trough-before
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import threading
import time
from pathlib import Path

import numpy as np

from sakura.formats import encoding_from_header, file_id
from sakura.net.client import RangeClient
from sakura.net.kernel import entered, kernel_link
from sakura.net.paced import PacedLink
from sakura.net.traces import Trace
from sakura.net.unpaced import UnpacedLink
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import get_policy
from sakura.server.run import start_server


def sample_tcp(ns, port: int, stop: threading.Event, t0: float, out: list) -> None:
    pat = {k: re.compile(rf"\b{k}:(\d+)") for k in ("bytes_sent", "bytes_acked", "cwnd")}
    while not stop.is_set():
        txt = ns.run(["ss", "-tin", "state", "established", f"( sport = :{port} )"], capture_output=True,
                     text=True).stdout
        flight, cwnd = 0, 0
        for block in txt.split("\n\t")[1:]:
            got = {k: int(m.group(1)) for k, p in pat.items() if (m := p.search(block))}
            flight += got.get("bytes_sent", 0) - got.get("bytes_acked", 0)
            cwnd = max(cwnd, got.get("cwnd", 0))
        out.append((time.monotonic() - t0, flight, cwnd))
        stop.wait(0.01)


def run(args) -> dict:
    trace = Trace(np.array([0.0, args.trough_at, args.trough_at + args.trough_s, 600.0]),
                  np.array([args.mbps, 0.0, args.mbps]), "trough")
    with contextlib.ExitStack() as stack:
        link = stack.enter_context(kernel_link()) if args.link == "kernel" else None
        if link is not None:
            stack.enter_context(entered(link.ns))
        srv = stack.enter_context(start_server(args.packs, process=True))
        client = stack.enter_context(RangeClient(srv.url))
        fid = file_id(args.template, "sakura")
        enc = encoding_from_header("sakura", client.header_bytes(fid)).fresh()
        units = enc.units
        initial_bps = args.mbps * 1e6
        policy, monitor = get_policy("sakura"), RuntimeMonitor(initial_bps, estimator=args.estimator)
        policy.begin(units, args.shard_s * (len(units) + 1), initial_bps)
        tcp: list = []
        stop = threading.Event()
        rows = []
        with (link.replaying(trace, 0.0) if link is not None else contextlib.nullcontext()) as replay:
            t0 = replay.t0 if replay is not None else time.monotonic()
            if link is not None:
                sampler = threading.Thread(target=sample_tcp, args=(link.ns, srv.port, stop, t0, tcp), daemon=True)
                sampler.start()
            ul = UnpacedLink(client) if link is not None else PacedLink(client, trace, 0.0)
            exec_end = t0 + args.shard_s  # a prelude
            for unit in units:
                unit = enc.priced(unit)
                deadline = t0 + args.shard_s * (unit.needed_by + 1)
                now = time.monotonic()
                decision = policy.choose(unit, now, deadline, monitor)
                est = monitor.rate_bps
                tr = ul.receive(ul.send(fid, enc.ranges(unit, decision.level)))
                active = monitor.observe(tr.nbytes, tr.t_request, tr.t_last_byte)
                rows.append({"unit": unit.index, "t_request": now - t0, "t_last": tr.t_last_byte - t0,
                             "estimate_mbps": est / 1e6, "measured_mbps": 8 * tr.nbytes / active / 1e6,
                             "nbytes": tr.nbytes, "level": decision.level.label})
                exec_end = max(exec_end, tr.t_last_byte) + args.shard_s
                time.sleep(max(0.0, exec_end - args.shard_s - time.monotonic()))  # the next unit: when this runs
            ul.close()
            time.sleep(0.1)
            stop.set()
            if link is not None:
                sampler.join(2)
            # (the paced link: the trace itself, as the device paces it)
            changes = list(replay.changes) if replay is not None else [
                [float(e), float(r)] for e, r in zip(trace.edges[:-1], trace.mbps)]
    return {"args": vars(args), "trace": {"t": [float(x) for x in trace.edges], "mbps": [float(x) for x in trace.mbps]},
            "tc_changes": changes, "units": rows, "tcp": tcp, "latency_s": exec_end - t0}


def plot(res: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ch = res["tc_changes"]
    end = max(r["t_last"] for r in res["units"]) + 0.2
    xs = [c[0] for c in ch] + [end]
    ys = [c[1] for c in ch] + [ch[-1][1]]
    ax.step(xs, ys, where="post", color="tab:orange", lw=2, label="shaped rate (tc tbf, as replayed)")
    u = res["units"]
    ax.plot([r["t_request"] for r in u], [r["estimate_mbps"] for r in u], "D", color="tab:green",
            label="SAKURA estimate R̂ at each choice")
    ax.plot([r["t_last"] for r in u], [r["measured_mbps"] for r in u], "x", color="tab:blue",
            label="each transfer's bytes / active time")
    ax.set_ylabel("Mbit/s")
    ax.set_ylim(0, max(max(ys), max(r["estimate_mbps"] for r in u), max(r["measured_mbps"] for r in u)) * 1.15)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title, fontsize=10)
    t = res["tcp"] or [(0.0, 0, 0)]  # (paced link: no kernel TCP state to read)
    ax2.plot([x[0] for x in t], [x[1] / 1e3 for x in t], color="tab:purple", label="server TCP bytes in flight (kB)")
    ax2.set_ylabel("kB in flight")
    ax3 = ax2.twinx()
    ax3.plot([x[0] for x in t], [x[2] for x in t], color="grey", lw=0.8, label="cwnd (segments)")
    ax3.set_ylabel("cwnd")
    ax2.legend(loc="upper left", fontsize=8)
    ax3.legend(loc="upper right", fontsize=8)
    ax2.set_xlabel("seconds since the edit started")
    ax2.set_xlim(0, end)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", default="packs")
    ap.add_argument("--template", default="fs-astronaut")
    ap.add_argument("--mbps", type=float, default=10.0)
    ap.add_argument("--trough-at", type=float, default=0.8)
    ap.add_argument("--trough-s", type=float, default=0.8)
    ap.add_argument("--shard-s", type=float, default=0.15)
    ap.add_argument("--estimator", default="robust-mpc")
    ap.add_argument("--link", choices=("kernel", "paced"), default="kernel")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(res, indent=1))
    plot(res, Path(f"{out}.png"), f"{args.link} link, {args.template}: {args.mbps:g} Mbit/s, 0 for {args.trough_s:g} "
         f"s at {args.trough_at:g} s, {args.shard_s:g} s a shard (compute simulated); estimator {args.estimator}")
    u = res["units"]
    print(json.dumps({"latency_s": round(res["latency_s"], 3), "units": [
        (round(r["t_request"], 3), round(r["estimate_mbps"], 2), round(r["measured_mbps"], 2), r["nbytes"])
        for r in u]}))


if __name__ == "__main__":
    main()
