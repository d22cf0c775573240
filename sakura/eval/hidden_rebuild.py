"""How much of the rebuild the real-clock pipeline hides behind execution, measured (not calculated).

Unlimited link, so SAKURA takes its largest stored configuration on every shard; real template server
process and sockets; the streamed edit's p50 latency against the oracle's (no transfer, no rebuild)
and the rebuild time its timelines recorded. Hidden share = 1 − (SAKURA − oracle) / rebuild.

    python -m sakura.eval.hidden_rebuild --packs packs [--runs 7] [--templates fs-astronaut,...]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from sakura.catalog import load_catalog
from sakura.eval.round_trips import warm
from sakura.net.client import RangeClient
from sakura.net.traces import Trace
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server
from sakura.systems import OURS

UNLIMITED = Network(Trace.constant(1e5), "fixed:1e5", 0.0, 1.0, "none")


def rebuild_busy_s(tl) -> float:
    """Time the reconstructor was busy: each unit from max(its arrival, the previous rebuild's end)."""
    busy, prev = 0.0, 0.0
    for u in tl.units:
        busy += u.rebuild_done_t - max(u.arrival_t, prev)
        prev = u.rebuild_done_t
    return busy


def measure(packs: str, template_id: str, runs: int) -> dict:
    tpl = load_catalog().get(template_id)
    with start_server(packs, port=0, process=True) as srv, RangeClient(srv.url) as client:
        warm(client, tpl.id, ("fp16", "sakura"))
        runtime = DeviceRuntime(client, calibration=CalibrationStore(repeats=2))
        req = runtime.session(tpl, "oracle", UNLIMITED).request(catalog_request=tpl.eval_requests[0])
        lat: dict[str, list[float]] = {"sakura": [], "oracle": []}
        rebuild = []
        for _ in range(runs):
            for system in lat:
                tl = runtime.session(tpl, system, UNLIMITED).run(req).timeline
                lat[system].append(tl.latency_s)
                if system == OURS:
                    rebuild.append(rebuild_busy_s(tl))
    s, o, r = statistics.median(lat["sakura"]), statistics.median(lat["oracle"]), statistics.median(rebuild)
    return {"sakura_p50_s": s, "oracle_p50_s": o, "rebuild_s": r, "rebuild_hidden_share": 1 - max(0.0, s - o) / r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", default="packs")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--templates", default="fs-astronaut,vton-astronaut,mb-coffee")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for tid in args.templates.split(","):
        print(tid, json.dumps({k: round(v, 4) for k, v in measure(args.packs, tid, args.runs).items()}), flush=True)


if __name__ == "__main__":
    main()
