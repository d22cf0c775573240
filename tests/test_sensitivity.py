"""Sensitivity studies (Fig. 16 / Fig. 18): the derived templates and models are what they claim."""

import tomllib

import numpy as np
import pytest

from sakura.catalog import load_catalog
from sakura.eval.sensitivity.resolution import growth_factors
from sakura.eval.sensitivity.sweep import measure_compute_cpu
from sakura.eval.sensitivity.variants import (
    BASE_TEMPLATE,
    MASK_RATIOS,
    fit_mask,
    mask_variant_id,
    model_fingerprint,
    res_variant_id,
    resolution_variant,
    save_resolution_models,
    scale_mask,
    write_manifest,
    write_mask_manifest,
    write_resolution_manifest,
)


def test_manifest_writer_round_trips(tmp_path):
    tables = [{"id": "a", "task": "fs", "mask": {"ellipse": [0.5, 0.4, 0.1, 0.2]}, "flag": True, "odd key": 1,
               "eval": ["skimage:lfw_subset:1",
                        {"ref": "x \"q\" ü 😀\t\\n", "crop": [0.0, 0.1, 0.5, 1.0], "flip": False}]}]
    path = write_manifest(tmp_path / "c.toml", tables, "n", "d")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    assert data["templates"] == tables and data["catalog"] == {"name": "n", "description": "d"}


def test_mask_manifest_hits_the_token_ratios(tmp_path):
    path = write_mask_manifest(tmp_path)
    cat = load_catalog(path)
    src = load_catalog().get(BASE_TEMPLATE)
    assert [t.id for t in cat] == [mask_variant_id(BASE_TEMPLATE, r) for r in MASK_RATIOS]
    for t, target in zip(cat, MASK_RATIOS):
        assert abs(t.token_ratio - target) <= 0.02, (t.id, t.token_ratio)
        # same image and the same requests: only the mask changes
        assert t.image_spec.key == src.image_spec.key and t.task == src.task and t.model == src.model
        assert [r.key for r in t.eval_requests] == [r.key for r in src.eval_requests]
        assert [r.key for r in t.profile_requests] == [r.key for r in src.profile_requests]
    ratios = [t.token_ratio for t in cat]
    assert ratios == sorted(ratios)
    # masks are nested: each larger mask contains the smaller one (scaled about the same centre)
    masks = [t.mask() for t in cat]
    assert all(not (a & ~b).any() for a, b in zip(masks, masks[1:]))


def test_fit_mask_box_and_clipping():
    mask, got = fit_mask({"box": [0.4, 0.4, 0.6, 0.6]}, 0.25)
    assert abs(got - 0.25) <= 0.02
    assert all(0.0 <= v <= 1.0 for v in mask["box"])
    with pytest.raises(ValueError):
        scale_mask({"png": "m.png"}, 2.0)


def test_resolution_variant_runs_a_masked_edit_at_192(tmp_path):
    from sakura.editing import edit_request
    from sakura.model import load_model

    base = load_model("sakura-tiny")
    tpl = load_catalog().get(BASE_TEMPLATE)
    v = resolution_variant(base, 192)
    assert (v.codec.resolution, v.codec.grid, v.codec.num_tokens) == (192, 24, 576)
    assert v.codec.ref_size == base.codec.ref_size * 3 // 4  # the reference scales with the image
    assert base.codec.resolution == 256  # the original is untouched
    assert resolution_variant(base, 384).codec.num_tokens == 2304

    req = edit_request(tpl, tpl.eval_requests[0], resolution=192, ref_size=v.codec.ref_size)
    cache = v.capture(req)
    assert cache.num_reused == 576 - int(v.token_mask(req.mask).sum())
    img = v.masked_edit(req, cache.provider()).image
    assert img.shape == (192, 192, 3) and np.isfinite(img).all()
    assert np.array_equal(img[~req.mask], req.template[~req.mask])  # unmasked pixels are the template's
    assert not np.allclose(img[req.mask], req.template[req.mask])

    # device compute on the CPU clock: one time per shard, fewer tokens cost less than all of them
    prof = measure_compute_cpu(v, req, cache, shard_size=2, repeats=1)
    assert len(prof.shard_s) == len(prof.shards) == v.num_steps * v.num_layers // 2
    assert all(t > 0 for t in prof.shard_s) and 0 < prof.masked_s < prof.local_full_s

    # the base model still runs at 256 after the variant installed its processors on its own copy
    req256 = edit_request(tpl, tpl.eval_requests[0])
    from sakura.runtime.compute import zero_cache

    assert base.masked_edit(req256, zero_cache(base, req256).provider()).image.shape == (256, 256, 3)

    # the route the figure takes: a saved model folder named by a derived manifest
    models = save_resolution_models(tmp_path, base, "sakura-tiny", (192, 256))
    assert models[256] == "sakura-tiny"
    cat = load_catalog(write_resolution_manifest(tmp_path, models))
    from sakura.model import load_model as load

    m192 = load(cat.get(res_variant_id(BASE_TEMPLATE, 192)).model)
    assert m192.codec.num_tokens == 576 and m192.codec.ref_size == base.codec.ref_size * 3 // 4
    assert model_fingerprint(m192) == model_fingerprint(base)


def test_growth_factors():
    def v(res, lat, nbytes):
        return {"image_tokens": (res // 8) ** 2, "fp16_cache_bytes": res**2, "masked_s": 1.0, "local_full_s": 2.0,
                "systems": {"sakura": {"latency_p50_s": lat, "latency_p90_s": lat, "bytes_mean": nbytes,
                                       "psnr_mean": 30.0}}}

    g = growth_factors({192: v(192, 1.0, 10), 256: v(256, 2.0, 20), 384: v(384, 5.0, 50)}, ["sakura"])
    assert set(g) == {"192->256", "256->384", "192->384"}
    assert g["192->384"]["pixels"] == pytest.approx(4.0) and g["192->384"]["image_tokens"] == 4.0
    assert g["256->384"]["sakura"]["latency_p50"] == pytest.approx(2.5)
    assert g["256->384"]["sakura"]["bytes"] == pytest.approx(2.5)
