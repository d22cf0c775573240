"""Shard executors: eager shards == masked_edit; ExecuTorch (XNNPACK) shards == eager; QNN fails clearly.

ExecuTorch export is slow (tens of seconds per block on this CPU), so the file exports ONE shard —
layers [0, 3) at shard size 3: both double blocks and the first single block, i.e. the stream
switch too — into a session-scoped cache folder and runs the rest eagerly (a partial offload).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request
from sakura.kvcache import KVCache
from sakura.model import load_model
from sakura.runtime.executors import BackendUnavailable, ShardExecutionError, export_shards, get_executor

TEMPLATE = "fs-astronaut"
SHARD_SIZE = 3
OFFLOAD = (0, 3)
IMAGE_TOL = 1e-3  # max abs pixel difference (images in [0, 1]), ExecuTorch vs eager


def random_cache(model, req) -> KVCache:
    """Seeded K/V of the template's geometry: executors must agree for any reusable K/V, and this
    skips a full capture run (the slow part of a real cache)."""
    reuse = torch.nonzero(~model.token_mask(req.mask)).flatten()
    cache = KVCache(model.num_steps, model.num_layers, model.heads, model.head_dim, reuse)
    g = torch.Generator().manual_seed(0)
    for s in range(model.num_steps):
        for layer in range(model.num_layers):
            cache.k[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g)
            cache.v[(s, layer)] = torch.randn(len(reuse), cache.dim, generator=g)
    return cache


@pytest.fixture(scope="module")
def setup():
    model = load_model("sakura-tiny")
    tpl = load_catalog().get(TEMPLATE)
    req = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    cache = random_cache(model, req)
    ref = model.masked_edit(req, cache.provider())
    return model, req, cache, ref


@pytest.fixture(scope="module")
def pte_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("pte")


def test_eager_shards_equal_masked_edit(setup):
    model, req, cache, ref = setup
    for shard_size in (1, SHARD_SIZE):
        res = get_executor("eager", model).run_masked_edit(req, cache.provider(), shard_size=shard_size)
        assert float(np.abs(res.image - ref.image).max()) <= 1e-6
        timings = res.extras["timings"]
        assert len(timings["shards"]) == model.num_steps * -(-model.num_layers // shard_size)


def test_explicit_attention_matches(setup):
    model, req, cache, ref = setup
    res = get_executor("eager", model, explicit=True).run_masked_edit(req, cache.provider(), shard_size=2)
    assert float(np.abs(res.image - ref.image).max()) <= 1e-4


def test_executorch_shard_equals_eager(setup, pte_cache):
    pytest.importorskip("executorch")
    model, req, cache, ref = setup
    ex = get_executor("executorch", model, cache_dir=pte_cache, offload={OFFLOAD})
    run = ex.prepare(req, SHARD_SIZE)
    (meta,) = ex.exports
    assert meta["layers"] == list(OFFLOAD) and not meta["cached"] and meta["delegates"] >= 1
    assert meta["max_abs_vs_eager"] <= 1e-3
    assert sorted(p.suffix for p in pte_cache.iterdir()) == [".json", ".pte"]
    image = run.run(cache.provider())
    err = float(np.abs(image - ref.image).max())
    assert err <= IMAGE_TOL, f"ExecuTorch image differs from eager by {err}"
    # the program ran: its shard was timed at every step
    assert [(s, a, b) for s, a, b, _ in run.timings.shards if (a, b) == OFFLOAD] == [(s, *OFFLOAD) for s in range(4)]

    # a second executor finds the exported file on disk (no re-export) and gives the same image
    ex2 = get_executor("executorch", model, cache_dir=pte_cache, offload={OFFLOAD})
    run2 = ex2.prepare(req, SHARD_SIZE)
    assert ex2.exports[0]["cached"]  # (how long a reload takes is bench-device's to measure, not a test's)
    assert np.array_equal(run2.run(cache.provider()), image)


def test_pte_key_follows_geometry_and_weights(setup, pte_cache):
    pytest.importorskip("executorch")
    from sakura.runtime.executors.eager import EagerExecutor
    from sakura.runtime.executors.executorch_backend import shard_path

    model, req, _, _ = setup
    run = EagerExecutor(model).prepare(req, SHARD_SIZE, load=False)
    p = shard_path(run, *OFFLOAD, cache_dir=pte_cache)
    assert p == shard_path(run, *OFFLOAD, cache_dir=pte_cache)
    tpl = load_catalog().get("vton-astronaut")  # another mask: other token counts
    other = EagerExecutor(model).prepare(edit_request(tpl, tpl.eval_requests[0]), SHARD_SIZE, load=False)
    assert shard_path(other, *OFFLOAD, cache_dir=pte_cache) != p
    w = model.transformer.transformer_blocks[0].ff.linear_out.weight
    with torch.no_grad():
        w[0, 0] += 1.0
        try:
            assert shard_path(run, *OFFLOAD, cache_dir=pte_cache) != p
        finally:
            w[0, 0] -= 1.0


def test_executorch_shard_with_locality_bias_equals_eager(tmp_path):
    """A model with a locality bias exports with its bias baked in for this mask: the program matches
    eager, and a mask of the same token counts elsewhere gets a program of its own."""
    pytest.importorskip("executorch")
    from dataclasses import replace

    from test_model import LOCAL

    from sakura.model import seeded_model
    from sakura.runtime.executors.eager import EagerExecutor
    from sakura.runtime.executors.executorch_backend import shard_path

    model = seeded_model("sakura-tiny", codec=replace(load_model("sakura-tiny").codec, **LOCAL))
    tpl = load_catalog().get(TEMPLATE)
    req = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    cache = random_cache(model, req)
    ref = model.masked_edit(req, cache.provider())
    ex = get_executor("executorch", model, cache_dir=tmp_path, offload={(2, 3)})
    run = ex.prepare(req, 1)
    assert ex.exports[0]["max_abs_vs_eager"] <= 1e-3
    err = float(np.abs(run.run(cache.provider()) - ref.image).max())
    assert err <= IMAGE_TOL, f"ExecuTorch image differs from eager by {err}"
    moved = edit_request(tpl, tpl.eval_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    moved.mask = np.roll(req.mask, 8, axis=1)  # one token to the right: same counts, other positions
    other = EagerExecutor(model).prepare(moved, 1, load=False)
    base = EagerExecutor(model).prepare(req, 1, load=False)
    assert other.signature(2, 3) == base.signature(2, 3)
    assert shard_path(other, 2, 3, cache_dir=tmp_path) != shard_path(base, 2, 3, cache_dir=tmp_path)


def test_shard_protocol_errors(setup):
    model, req, cache, _ = setup
    run = get_executor("eager", model).prepare(req, 4)
    with pytest.raises(ShardExecutionError, match="out of order"):
        run.run_shard(0, 0, 4, {})
    run.begin_step(0)
    with pytest.raises(ShardExecutionError, match="out of order"):
        run.run_shard(0, 4, 8, {})
    with pytest.raises(ShardExecutionError, match="no K/V"):
        run.run_shard(0, 0, 4, {(0, 0): cache.get(0, 0)})
    with pytest.raises(ShardExecutionError, match="before the last step"):
        run.result()


def test_sd3_is_refused_clearly():
    model = load_model("sakura-tiny-sd3")
    tpl = load_catalog().get("mb-sd-rocket")
    req = edit_request(tpl, tpl.eval_requests[0])
    with pytest.raises(ShardExecutionError, match="Flux2"):
        get_executor("eager", model).prepare(req, 2)


def _qualcomm_modules() -> set[str]:
    return {m for m in sys.modules if m.startswith("executorch.backends.qualcomm")}


def test_qnn_without_sdk_is_unavailable(setup, monkeypatch, tmp_path):
    model, req, _, _ = setup
    before = _qualcomm_modules()
    monkeypatch.delenv("QNN_SDK_ROOT", raising=False)
    with pytest.raises(BackendUnavailable, match="QNN_SDK_ROOT is not set"):
        export_shards(model, req, SHARD_SIZE, backend="qnn", out_dir=tmp_path)
    with pytest.raises(BackendUnavailable, match="QNN_SDK_ROOT"):
        get_executor("qnn", model)
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path))  # a folder that is no SDK
    with pytest.raises(BackendUnavailable, match="libQnnHtp.so"):
        export_shards(model, req, SHARD_SIZE, backend="qnn", out_dir=tmp_path)
    monkeypatch.setenv("QNN_SDK_ROOT", str(tmp_path / "missing"))
    with pytest.raises(BackendUnavailable, match="not a folder"):
        export_shards(model, req, SHARD_SIZE, backend="qnn", out_dir=tmp_path)
    assert _qualcomm_modules() == before  # never imported the Qualcomm backend (its setup downloads an SDK)
    assert list(tmp_path.iterdir()) == []
