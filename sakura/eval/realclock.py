"""`sakura bench --clock real`: the same sweep through a real template server process, real sockets
and a link shaped by the trace in wall-clock time (slower: every edit takes its real latency)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sakura.eval import bench as B
from sakura.net.client import RangeClient
from sakura.net.shaping import RateSpec
from sakura.net.traces import load_trace
from sakura.offline.builder import file_id
from sakura.online.encodings import encoding_from_header
from sakura.online.policies import get_policy
from sakura.runtime.stream import StreamedEdit, read_header
from sakura.runtime.timeline import Timeline
from sakura.server.run import start_server


def run_one_real(tb: B.TemplateBench, req_index: int, system: str, trace: str, scale: float, start: float,
                 base_url: str) -> dict:
    req = tb.request(req_index)
    pol = get_policy(system)
    if system in ("local", "oracle"):
        res = (tb.model.full_edit(req) if system == "local"
               else tb.model.masked_edit(req, lambda s, l: tb.fp16_kv[(s, l)]))
        tl = Timeline(system, "real", latency_s=res.seconds)
    else:
        fid = file_id(tb.template.id, pol.encoding)
        link = RangeClient(base_url, rate=RateSpec(trace, start, scale))
        enc = encoding_from_header(pol.encoding, read_header(link, fid))
        link.reset_link()
        initial = float(load_trace(trace).scaled(scale).rate_at(start)) * 1e6
        res, tl = StreamedEdit(tb.model, enc, pol, link, fid, tb.compute, initial).run(req)
        link.close()
    return {**B.record(tb, req_index, system, start, tl, res.image), "clock": "real"}


def run_bench_real(cfg: B.BenchConfig, out: Path, progress=None, say=print) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    base_trace = load_trace(cfg.trace)
    rng = np.random.default_rng(cfg.seed)
    summary: dict = {"config": {**{k: str(v) for k, v in cfg.__dict__.items()}, "clock": "real"}, "workloads": {}}
    with start_server(cfg.packs, port=0, process=True) as srv, (out / "records.jsonl").open("w") as rec_file:
        for workload in cfg.workloads:
            tbs = B.workload_benches(workload, cfg, {}, say)
            scales = {tb.template.id: B.regime_scale(tb, base_trace, cfg.regime, cfg.trace_scale) for tb in tbs}
            starts = rng.uniform(0, base_trace.duration, size=cfg.starts)
            records = []
            task = progress.add_task(f"bench {workload} (real clock)", total=cfg.starts * len(cfg.systems)) if progress else None
            for tb, req_index, start in B.offset_plan(tbs, starts):
                for system in cfg.systems:
                    r = run_one_real(tb, req_index, system, cfg.trace, scales[tb.template.id], start, srv.url)
                    r["workload"] = workload
                    records.append(r)
                    rec_file.write(json.dumps(r) + "\n")
                    if progress:
                        progress.advance(task)
            ws = B.summarize(records, B.storage_of(tbs))
            ws["regime"] = B.regime_block(tbs, scales, base_trace, cfg.trace)
            for system, s in ws.items():
                if system in B.SYSTEMS:
                    s["device_peak_rss_bytes"] = None  # one shared process here: see the sim summary's model
            summary["workloads"][workload] = ws
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
