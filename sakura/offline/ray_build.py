"""Catalog builds on Ray (``sakura build --ray [ADDRESS]``): one task per template, fanned out over the cluster.

Each task profiles, factorises and writes one template's packs into a staging folder, then publishes them
into the store (:func:`sakura.offline.publish.build_into_store`): write first, publish after. A task whose
worker dies is retried by Ray (``max_retries``); the dead attempt left at most unreferenced objects, which
no reader can see. Templates whose packs for the same build key are already published are skipped.

Workers are reused across tasks and the model cache lives in the worker process
(:func:`sakura.editing.model_for`), so a model is loaded once per worker, not once per template.
Credentials and the endpoint of the store travel to the workers as environment variables (AWS_*).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from sakura.catalog import load_catalog
from sakura.net.stores import open_store
from sakura.offline.publish import BuildSettings, Published, build_into_store

TASK_RETRIES = 3
FORWARDED_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "HF_HUB_OFFLINE")


def _build_task(catalog_path: str | None, template_id: str, store_url: str, settings: dict, force: bool,
                build: Callable | None) -> dict:
    """One template, in a Ray worker: load the catalog (cached per worker), build, publish."""
    import torch

    torch.set_num_threads(1)  # one task per CPU: more threads only fight over the same cores
    template = load_catalog(catalog_path).get(template_id)
    store = open_store(store_url, create=True)
    kw = {"build": build} if build is not None else {}
    result = build_into_store(template, store, BuildSettings(**settings), force=force, **kw)
    return {**asdict(result), "pid": os.getpid()}


class RayUnavailable(RuntimeError):
    """No Ray cluster at the address given to ``--ray``."""


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on a cluster address nothing answers at (ray.init would retry for minutes)."""
    import socket

    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself (and refuses quickly when wrong)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"no Ray cluster answers at {address} ({e}); start one with `ray start --head` "
                              "or use --ray local") from None


def init_ray(address: str | None, num_cpus: int | None = None):
    """Connect to the cluster at ``address`` ("auto": the one this machine belongs to), or start a local one."""
    import ray

    env = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
    runtime_env = {"env_vars": {**env, "OMP_NUM_THREADS": "1"}}
    if ray.is_initialized():
        return ray
    if address and address != "local":
        check_reachable(address)
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count(), runtime_env=runtime_env, log_to_driver=False,
                 include_dashboard=False)
    return ray


def ray_build(
    templates,
    store_url: str,
    settings: BuildSettings = BuildSettings(),
    *,
    address: str | None = None,
    num_cpus: int | None = None,
    catalog_path: str | Path | None = None,
    force: bool = False,
    build: Callable | None = None,
    retries: int = TASK_RETRIES,
    on_done: Callable[[Published], None] | None = None,
) -> list[Published]:
    """Build ``templates`` as Ray tasks into the store at ``store_url``; returns one result per template in
    completion order. ``build`` replaces the per-template builder (tests); it must be importable by workers."""
    store = open_store(store_url, create=True)
    results: list[Published] = []
    todo = []
    for template in templates:  # skipped here already: a catalog that is all built needs no cluster
        key = settings.key(template)
        if not force and store.has_build(template.id, key):
            results.append(Published(template.id, "skipped", 0.0, key))
            if on_done:
                on_done(results[-1])
        else:
            todo.append(template)
    if not todo:
        return results
    ray = init_ray(address, num_cpus)
    task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=False)(_build_task)
    catalog = str(catalog_path) if catalog_path else None
    pending = {task.remote(catalog, t.id, store_url, asdict(settings), force, build): t.id for t in todo}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        got = ray.get(done[0])
        pending.pop(done[0])
        got.pop("pid", None)
        result = Published(**got)
        results.append(result)
        if on_done:
            on_done(result)
    return results


def build_throughput(results: list[Published], wall_s: float) -> dict:
    built = [r for r in results if r.status == "built"]
    return {"templates": len(results), "built": len(built), "skipped": len(results) - len(built),
            "wall_s": round(wall_s, 2), "templates_per_min": round(60 * len(built) / wall_s, 2) if built else 0.0,
            "task_s_mean": round(sum(r.seconds for r in built) / len(built), 2) if built else 0.0}


def timed_ray_build(*args, **kw) -> tuple[list[Published], dict]:
    t0 = time.perf_counter()
    results = ray_build(*args, **kw)
    return results, build_throughput(results, time.perf_counter() - t0)
