"""`sakura build --out s3://...` and `sakura build --ray ADDRESS`: builds published into a pack store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from sakura.net.stores import open_store
from sakura.offline.builder import DEFAULT_BASIS
from sakura.offline.publish import BuildSettings, Published, build_into_store


def _say(result: Published) -> None:
    size = f", SAKURA {result.sakura_bytes / 1e6:.1f} MB" if result.sakura_bytes else ""
    typer.echo(f"{result.template_id}: {result.status} in {result.seconds:.1f} s{size}")


def build_to_store(templates, out: str, *, q: float, max_rank: int, shard_size: int, model_path: Path | None,
                   ray: str | None, ray_workers: int | None, catalog: Path | None, force: bool,
                   basis: str = DEFAULT_BASIS, rebuild_rank: int | None = None) -> dict:
    """Build each template (skipping those already published with the same build key) into the store at
    ``out``, in this process or as Ray tasks; prints one line per template and the throughput."""
    settings = BuildSettings(q, max_rank, shard_size, str(model_path) if model_path else None, basis, rebuild_rank)
    store = open_store(out, create=True)  # fail here, not in a worker, on a bad URL or credentials
    t0 = time.perf_counter()
    if ray is None:
        results = []
        for tpl in templates:
            results.append(build_into_store(tpl, store, settings, force=force))
            _say(results[-1])
    else:
        from sakura.offline.ray_build import ray_build  # Ray's module: only with --ray

        results = ray_build(templates, store.url, settings, address=ray, num_cpus=ray_workers,
                            catalog_path=catalog.resolve() if catalog else None, force=force, on_done=_say)
    from sakura.offline.ray_build import build_throughput  # cli module: imports on use

    summary = {"store": store.url, "ray": ray, **build_throughput(results, time.perf_counter() - t0)}
    typer.echo(json.dumps(summary))
    return summary
