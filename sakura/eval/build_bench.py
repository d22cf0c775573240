"""Catalog build throughput on Ray, and what it projects to at paper scale.

``python -m sakura.eval.build_bench --store s3://bucket/prefix --workers 1,2 --templates a,b,c,d`` builds the
templates with ``--ray local`` once per worker count (each into a fresh prefix, a fresh local Ray), prints
templates/minute, then projects the cost of one template at the paper's geometry from the measured
per-stage seconds (a *projection*, not a measurement):

* capture and importance profiling are model forward passes: scaled by the ratio of per-step transformer
  work, layers × tokens × d² (the FLUX.2-klein-4B geometry of :mod:`sakura.eval.projection` vs ours);
* the SAKURA pack is dominated by one truncated SVD per cache unit: scaled by units × n·d·min(n, d);
* the baselines' encodings stream over the cache bytes: scaled by layers × d.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.eval.projection import SETTINGS
from sakura.net.stores import open_store
from sakura.offline.publish import BuildSettings
from sakura.offline.ray_build import timed_ray_build


def stage_seconds(store, template_id: str) -> dict[str, float]:
    """The per-stage seconds the build recorded (``<id>.build.json``, published with the packs)."""
    index = store.index(template_id)
    key = index["extras"][f"{template_id}.build.json"]
    return json.loads(store.client.get_object(Bucket=store.bucket, Key=key)["Body"].read())["seconds"]


def project(seconds: dict[str, float], ours: dict, paper_name: str = "flux2-klein-4b") -> dict:
    """Seconds per template at the paper's geometry, by stage, from ours (see the module docstring)."""
    p = SETTINGS[paper_name]
    d_paper, d_ours = p.heads * p.head_dim, ours["d"]
    n_paper, n_ours = 0.9 * p.tokens, ours["n"]  # reusable tokens: ~90% of the image at a 10% mask
    model = (p.layers * p.tokens * d_paper ** 2) / (ours["layers"] * ours["tokens"] * d_ours ** 2)
    svd = (p.layers * n_paper * d_paper * min(n_paper, d_paper)) / (
        ours["layers"] * n_ours * d_ours * min(n_ours, d_ours)
    )
    stream = (p.layers * d_paper) / (ours["layers"] * d_ours)
    factor = {"capture": model, "importance": model, "sakura": svd}
    projected = {k: v * factor.get(k, stream) for k, v in seconds.items()}
    return {"factors": {"model": round(model, 1), "svd": round(svd, 1), "stream": round(stream, 1)},
            "per_template_s": round(sum(projected.values()), 1),
            "by_stage_s": {k: round(v, 1) for k, v in projected.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.eval.build_bench")
    ap.add_argument("--store", required=True, help="s3://bucket/prefix (each run gets a fresh sub-prefix)")
    ap.add_argument("--templates", default="fs-astronaut,fs-grace-hopper,vton-astronaut,vton-grace-hopper")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--count", type=int, default=10_000, help="catalog size to project")
    a = ap.parse_args(argv)
    import ray

    cat = load_catalog()
    chosen = [cat.get(t) for t in a.templates.split(",")]
    runs = {}
    for workers in (int(w) for w in a.workers.split(",")):
        url = f"{a.store.rstrip('/')}/bench-{workers}w-{secrets.token_hex(3)}"
        t0 = time.perf_counter()
        results, summary = timed_ray_build(chosen, url, BuildSettings(), address="local", num_cpus=workers)
        ray.shutdown()
        runs[workers] = {**summary, "with_ray_start_s": round(time.perf_counter() - t0, 1), "store": url}
        print(json.dumps({"workers": workers, **runs[workers]}), flush=True)
    print(json.dumps(projection(runs, chosen, a.count), indent=1))


def projection(runs: dict, chosen: list, count: int) -> dict:
    """Per-template cost from the run with the fewest workers (the least contended), at our scale and the paper's."""
    base = runs[min(runs)]
    store = open_store(base["store"])
    seconds: dict[str, float] = {}
    for t in chosen:
        for k, v in stage_seconds(store, t.id).items():
            seconds[k] = seconds.get(k, 0.0) + v / len(chosen)
    model = model_for(chosen[0])
    tokens = model.codec.num_tokens
    ours = {"d": model.heads * model.head_dim, "layers": model.num_layers, "tokens": tokens, "n": 0.9 * tokens}
    paper = project(seconds, ours)
    per_template_s = base["task_s_mean"]  # one template on one worker, model load amortised, publish included
    return {"measured_stage_s": {k: round(v, 2) for k, v in seconds.items()}, "measured_task_s": per_template_s,
            "ours": ours, "paper": paper, "templates": count,
            "ours_worker_hours": round(count * per_template_s / 3600, 1),
            "paper_worker_hours": round(count * paper["per_template_s"] / 3600, 1)}


if __name__ == "__main__":
    main()
