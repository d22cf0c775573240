"""Catalog builds on Ray into a real S3 store (SeaweedFS), then streamed edits that read the store.

One local Ray (2 CPUs) for the module. Builds use the same settings as the session's folder packs
(``fs_packs``: max rank 32), so the store's packs and the folder's must give the same image."""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from sakura.catalog import load_catalog
from sakura.formats import file_id
from sakura.net.folder import FolderSource
from sakura.net.store_reader import link_for_server
from sakura.net.stores import open_store
from sakura.net.traces import Trace
from sakura.offline.publish import BuildSettings
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.session import DeviceRuntime, Network
from sakura.server.run import start_server

ray = pytest.importorskip("ray")
from sakura.offline.ray_build import init_ray, ray_build  # noqa: E402

SETTINGS = BuildSettings(max_rank=32, output_weights=False)  # as fs_packs, less the output weights (unused here)
UNLIMITED = Network(Trace.constant(1e7), "fixed:1e7", 0.0, 1.0, "none")


@pytest.fixture(scope="module")
def local_ray(s3):
    init_ray("local", num_cpus=2)  # after the store fixture: workers inherit its AWS_* variables
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test builders travel by value
    yield
    ray.shutdown()


def payload(raw: bytes) -> bytes:
    """A pack without its JSON header (the header records how long the build took)."""
    return raw[8 + int.from_bytes(raw[:8], "little"):]


def streamed_images(source, tpl, calibration) -> dict:
    """A real-clock streamed edit of the FP16 file (one level: no choice depends on timing) and a SAKURA
    edit on the simulated clock (the pack's bytes read from ``source``, levels chosen on the trace integral,
    so a loaded machine cannot change them); the real-clock SAKURA path is tests/test_runtime.py's."""
    from sakura.online.policies import get_policy

    runtime = DeviceRuntime(source, calibration=calibration)
    out = {}
    for system in ("fp16", "sakura"):
        # (SAKURA unpriced: a rebuild-priced choice reads each run's measured decode times)
        policy = get_policy("sakura", price_rebuild=False) if system == "sakura" else None
        session = runtime.session(tpl, system, UNLIMITED, policy=policy)
        req = session.request(catalog_request=tpl.eval_requests[0])
        out[system] = (session.run(req) if system == "fp16" else session.simulate(req)).image
    return out


def die_mid_build(template, out_dir, *, progress=None, store_url: str, **kw):
    """A build whose worker is killed after part of its packs reached the store, before publishing."""
    Path(out_dir, f"{template.id}.pack").write_bytes(b"half a pack")
    store = open_store(store_url)
    store.client.put_object(Bucket=store.bucket, Key=store._key("objects", f"{template.id}.partial.pack"),
                            Body=b"half a pack")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(scope="module")
def built(local_ray, s3):
    """A build of fs-astronaut whose worker is killed mid-build (no retry), what the store shows then,
    and the rerun: both fs templates built with --ray into the same store."""
    cat = load_catalog()
    chosen = [cat.get("fs-astronaut"), cat.get("fs-grace-hopper")]
    url = s3.url("ray")
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray_build(chosen[:1], url, SETTINGS, build=functools.partial(die_mid_build, store_url=url), retries=0)
    store = open_store(url)
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store._key("objects"))
    after_kill = {"templates": store.templates(), "key": store.published_key("fs-astronaut"),
                  "objects": [o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])]}
    results = ray_build(chosen, url, SETTINGS)
    return {"url": url, "store": store, "chosen": chosen, "after_kill": after_kill, "results": results}


def test_killed_worker_leaves_nothing_visible_and_the_rerun_completes(built):
    assert built["after_kill"] == {"templates": {}, "key": None, "objects": ["fs-astronaut.partial.pack"]}
    assert sorted((r.template_id, r.status) for r in built["results"]) == [("fs-astronaut", "built"),
                                                                          ("fs-grace-hopper", "built")]
    store = built["store"]
    assert set(store.templates()) == {"fs-astronaut", "fs-grace-hopper"}
    assert store.published_key("fs-astronaut") == SETTINGS.key(built["chosen"][0])
    assert all(".partial." not in e["key"] for e in store.index("fs-astronaut")["files"].values())


def test_stream_from_store_matches_folder_and_a_second_build_skips(built, fs_packs):
    packs, tpl = fs_packs
    store, url = built["store"], built["url"]
    fid = file_id(tpl.id, "sakura")
    assert payload(store.read(fid, 0, store.size(fid))) == payload((packs / f"{fid}.pack").read_bytes())

    calibration = CalibrationStore(repeats=2)  # one measurement for both edits
    with start_server(url, port=0, process=True) as srv, link_for_server(srv.url) as from_store:
        from_the_store = streamed_images(from_store, tpl, calibration)
    with FolderSource(packs) as from_folder:
        from_the_folder = streamed_images(from_folder, tpl, calibration)
    for system in ("fp16", "sakura"):
        np.testing.assert_array_equal(from_the_store[system], from_the_folder[system])

    again = ray_build(built["chosen"], url, SETTINGS)
    assert sorted(r.status for r in again) == ["skipped", "skipped"]


def test_loadtest_against_two_server_replicas_and_the_store(built):
    from sakura.eval.loadtest import LoadConfig, run_load

    with start_server(built["url"], port=0, process=True) as a, start_server(built["url"], port=0, process=True) as b:
        summary = run_load(LoadConfig([a.url, b.url], clients=4, edits=1, trace="fixed:200"))
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["edits"] == 4 and summary["templates"] == ["fs-astronaut", "fs-grace-hopper"]
    assert summary["shards"] == 4 * 16 and summary["mbytes"] > 0
    assert 0 < summary["time_to_shard_p50_s"] <= summary["time_to_shard_p99_s"]
