"""Masked execution with template KV reuse on both diffusers families (issue 2's must-shows)."""

import numpy as np
import pytest
import torch

from sakura.model import EditRequest, ModelInputError, ModelLoadError, load_model, seeded_model
from sakura.model.base import resize_image
from sakura.model.embedded import load_model_folder, save_model

# the embedded model's newer codec: references aligned onto the mask, a 2-D locality bias, fill-style fs/vton
LOCAL = {"ref_mode": "aligned", "locality": (0.0, 0.3, 0.6, 1.2), "blank_tasks": ("fs", "vton")}


def plain_codec(name: str):
    """The codec with no option on (references as tokens, no bias, template pixels visible): what the first
    shipped model used; each test turns on the options it is about (the embedded default has them all on)."""
    from sakura.model.base import CodecConfig

    return CodecConfig(resolution=256, patch=8, ref_size=64, num_steps=6 if name.endswith("sd3") else 4)


def sharpened(name: str, codec_changes: dict | None = None):
    """A seeded model with larger random weights, so every output depends strongly on every input
    (a freshly initialised DiT barely reacts to its inputs, which would make equalities vacuous)."""
    from dataclasses import replace

    m = seeded_model(name, codec=replace(plain_codec(name), **(codec_changes or {})))
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.transformer.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return m


def request(task: str, frac=(0.15, 0.45, 0.35, 0.6), seed=0) -> EditRequest:
    from skimage import data

    img = resize_image(data.astronaut() / 255.0, 256)
    mask = np.zeros((256, 256), bool)
    y0, x0, y1, x1 = (int(f * 256) for f in frac)
    mask[y0:y1, x0:x1] = True
    ref = resize_image(data.coffee()[100:300, 100:300] / 255.0, 64) if task in ("fs", "vton") else None
    return EditRequest(img, mask, task, prompt="make it red" if task == "mb" else "", reference=ref, seed=seed)


CASES = [("sakura-tiny", "fs"), ("sakura-tiny", "mb"), ("sakura-tiny-sd3", "mb")]
LOCAL_CASES = [("sakura-tiny", "fs", LOCAL),
               ("sakura-tiny", "mb", LOCAL | {"ref_mode": "both", "patch_context": False})]


@pytest.mark.parametrize("name,task,codec", [(*c, None) for c in CASES] + LOCAL_CASES)
def test_masked_run_with_exact_cache_reproduces_full_run(name, task, codec):
    m = sharpened(name, codec)
    req = m.self_conditioned(request(task))
    full = m.full_edit(req, capture=True)
    assert full.cache.num_reused == int((~m.token_mask(req.mask)).sum())
    exact = m.masked_edit(req, full.cache.provider())
    np.testing.assert_allclose(exact.image, full.image, atol=2e-5)
    # an FP16 round trip of the cache is close but not identical
    fp16 = m.masked_edit(req, full.cache.provider(torch.float16))
    assert np.abs(fp16.image - full.image).max() < 5e-3
    # the test can fail: a wrong cache gives a visibly different output inside the mask
    wrong = m.masked_edit(req, lambda s, l: tuple(torch.zeros_like(t) for t in full.cache.get(s, l)))
    assert np.abs(wrong.image - full.image).max() > 1e-2
    # outside the mask the output is the template
    np.testing.assert_array_equal(full.image[~req.mask], req.template[~req.mask])


@pytest.mark.parametrize("name,task", CASES[1:])
def test_full_mask_masked_run_equals_full_run(name, task):
    m = sharpened(name)
    req = request(task)
    req.mask[:] = True
    full = m.full_edit(req, capture=True)
    assert full.cache.num_reused == 0
    masked = m.masked_edit(req, full.cache.provider())
    np.testing.assert_allclose(masked.image, full.image, atol=2e-5)


@pytest.mark.parametrize("name", ["sakura-tiny", "sakura-tiny-sd3"])
def test_detach_restores_stock_model_bit_for_bit(name):
    m = sharpened(name)
    req = request("mb")
    stock = m.full_edit(req).image  # full_edit without capture runs the stock processors
    m.attach()
    m.masked_edit(req, m.capture(req).provider(), probe=True)
    m.detach()
    procs = {type(mod.processor).__module__ for mod in m.attention_modules}
    assert all(p.startswith("diffusers") for p in procs)
    np.testing.assert_array_equal(m.full_edit(req).image, stock)


@pytest.mark.parametrize("name,task,codec", [("sakura-tiny", "fs", None), ("sakura-tiny-sd3", "mb", None),
                                              LOCAL_CASES[0]])
def test_attention_probe_matches_brute_force(name, task, codec, monkeypatch):
    """Probe vs the full attention matrix recorded during a full run of the same request (the
    locality bias included: importance is what attention really gives)."""
    m = sharpened(name, codec)
    req = m.self_conditioned(request(task))
    recorded = {}
    original = type(m)._joint_attention

    def record(self, layer, q, k, v, reuse_pos, masked_pos, bias=None):
        recorded[(self.ctx.step, layer)] = (q.clone(), k.clone(), reuse_pos, bias)
        return original(self, layer, q, k, v, reuse_pos, masked_pos, bias)

    monkeypatch.setattr(type(m), "_joint_attention", record)
    full = m.full_edit(req, capture=True)
    monkeypatch.setattr(type(m), "_joint_attention", original)
    probe = m.masked_edit(req, full.cache.provider(), probe=True).importance

    tmask = m.token_mask(req.mask)
    rows = torch.nonzero(tmask).flatten()
    offset = 0 if m.family == "sd3" else req_text_len(m)
    for key, (q, k, reuse_pos, bias) in recorded.items():
        logits = q.double() @ k.double().transpose(-1, -2) * q.shape[-1] ** -0.5
        p = torch.softmax(logits if bias is None else logits + bias.double(), dim=-1)
        brute = p[0][:, rows + offset][:, :, reuse_pos].square().sum(dim=(0, 1))
        torch.testing.assert_close(probe[key].double(), brute, rtol=1e-4, atol=1e-7)
    assert len(probe) == m.num_steps * m.num_layers


def req_text_len(m) -> int:
    return m.text_encoder.cfg.max_tokens


def test_bad_inputs_raise_clear_errors():
    m = seeded_model("sakura-tiny")
    req = request("mb")
    with pytest.raises(ModelInputError, match="mask must be"):
        m.full_edit(EditRequest(req.template, req.mask[:100], "mb", prompt="x"))
    with pytest.raises(ModelInputError, match="non-empty prompt"):
        m.full_edit(EditRequest(req.template, req.mask, "mb", prompt="  "))
    with pytest.raises(ModelInputError, match="reference"):
        m.full_edit(EditRequest(req.template, req.mask, "fs"))
    with pytest.raises(ModelInputError, match="empty"):
        m.full_edit(EditRequest(req.template, np.zeros_like(req.mask), "mb", prompt="x"))


def test_model_folder_roundtrip_and_errors(tmp_path):
    m = sharpened("sakura-tiny")
    save_model(m, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    req = request("mb")
    np.testing.assert_array_equal(loaded.full_edit(req).image, m.full_edit(req).image)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model_folder(tmp_path / "nope")
    (tmp_path / "m" / "text_encoder" / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="missing text_encoder/model.safetensors"):
        load_model_folder(tmp_path / "m")
    with pytest.raises(ModelLoadError, match="unknown embedded model|does not exist"):
        load_model("sakura-huge")


def test_fill_style_tasks_never_see_the_template_under_the_mask(tmp_path):
    """With ``codec.blank_tasks`` the edit cannot depend on the hidden pixels (and the setting
    survives a save/load); without it, the same change of hidden pixels changes the edit."""
    m = sharpened("sakura-tiny")
    req = request("fs")
    other = req.template.copy()
    other[req.mask] = 1.0 - other[req.mask]  # different content under the mask only
    changed = EditRequest(other, req.mask, "fs", reference=req.reference, seed=req.seed)
    assert np.abs(m.full_edit(changed).image - m.full_edit(req).image)[req.mask].max() > 1e-2
    m.codec.blank_tasks = ("fs", "vton")
    save_model(m, tmp_path / "fill")
    fill = load_model(tmp_path / "fill")
    assert fill.codec.blank_tasks == ("fs", "vton")
    np.testing.assert_array_equal(fill.full_edit(changed).image[req.mask], fill.full_edit(req).image[req.mask])
    # the cached path agrees with the full path under fill-style conditioning too
    base = fill.self_conditioned(req)
    cache = fill.full_edit(base, capture=True)
    np.testing.assert_allclose(fill.masked_edit(base, cache.cache.provider()).image, cache.image, atol=2e-5)


def test_distance_bias_is_local_between_image_tokens_only():
    from sakura.model.base import distance_bias

    grid = 32
    img = torch.tensor([0, 1, 33, 5 * 32 + 7])  # (0,0) (0,1) (1,1) (5,7)
    reused = torch.tensor([2, 64])  # (0,2) (2,0)
    b = distance_bias((0.0, 0.5), grid, [3, img, 2], [3, img, 2, reused])
    assert b.shape == (1, 2, 9, 11)
    assert (b[0, 0] == 0).all()  # slope 0: a global head
    h = b[0, 1]
    assert (h[:3] == 0).all() and (h[:, :3] == 0).all() and (h[7:] == 0).all() and (h[:, 7:9] == 0).all()
    torch.testing.assert_close(h[3, 4], torch.tensor(-0.5))  # neighbours
    torch.testing.assert_close(h[3, 5], torch.tensor(-0.5 * 2**0.5))
    torch.testing.assert_close(h[6, 3], torch.tensor(-0.5 * (25 + 49) ** 0.5))
    torch.testing.assert_close(h[3, 10], torch.tensor(-1.0))  # a reusable key 2 rows down
    assert torch.equal(h[3:7, 3:7], h[3:7, 3:7].T)


def test_aligned_reference_lands_on_the_mask_and_drives_the_edit():
    """The aligned reference is the reference resized onto the mask's bounding box, only inside the
    mask; a different reference changes the edit inside the mask, never outside."""
    m = sharpened("sakura-tiny", LOCAL)
    req = request("vton")
    al = m.aligned_reference(req)
    tmask = m.token_mask(req.mask)
    assert al.shape == (m.codec.num_tokens, m.codec.patch_dim)
    assert al[~tmask].abs().max() == 0 and al[tmask].abs().mean() > 0.1
    assert m.reference_tokens(req) is None  # aligned only: no reference tokens to compute
    other = EditRequest(req.template, req.mask, "vton", reference=1.0 - req.reference, seed=req.seed)
    a, b = m.full_edit(req).image, m.full_edit(other).image
    assert np.abs(a - b)[req.mask].max() > 1e-2
    np.testing.assert_array_equal(a[~req.mask], b[~req.mask])


def test_without_patch_context_masked_tokens_see_no_pixel_around_the_mask(tmp_path):
    """``patch_context=False``: changing template pixels that lie outside the mask but inside a masked
    token's patch changes nothing in the masked tokens' inputs, so the edit can only learn them from
    the reusable tokens (fill-style tasks hide the pixels under the mask as well; mb keeps them)."""
    m = sharpened("sakura-tiny", LOCAL | {"patch_context": False})
    save_model(m, tmp_path / "m")
    assert load_model(tmp_path / "m").codec.patch_context is False
    for task in ("fs", "mb"):
        req = request(task)
        req.mask[:] = False
        yy, xx = np.mgrid[:256, :256]
        req.mask[(yy - 100) ** 2 + (xx - 130) ** 2 < 45**2] = True  # a disc: boundary tokens are partial
        tmask = m.token_mask(req.mask)
        x0, _ = m.template_tokens(req)
        cond = m.conditioning_tokens(req, x0)
        px = torch.from_numpy(req.mask.astype(np.float32))[..., None]
        from sakura.model.base import patchify

        mpx = patchify(px, m.codec.patch)
        outside_in_masked = (mpx == 0) & tmask[:, None]
        assert outside_in_masked.any()
        c = cond.unflatten(-1, (-1, 3))
        assert c[outside_in_masked].abs().max() == 0
        inside = mpx > 0
        assert (c[inside].abs().max() == 0) == (task == "fs")
        torch.testing.assert_close(cond[~tmask], x0[~tmask])  # the reusable tokens see their pixels


def test_instruction_reaches_every_token_and_the_cache_stays_exact(tmp_path):
    """Flux2 has no pooled-text input: the instruction (our text encoder's pooled projection) joins the time
    embedding through a hook on ``time_guidance_embed``. Zero at initialisation (a warm start computes what
    the old weights did); once learnt, the colour word alone changes a text edit, the masked run on the exact
    cache still reproduces the full run, the shard executor runs it too, and a saved folder keeps it."""
    from dataclasses import replace

    from sakura.runtime.executors import get_executor

    m = sharpened("sakura-tiny")
    req = m.self_conditioned(request("mb"))
    before = m.full_edit(req).image
    proj = m.text_encoder.instruction_proj
    assert proj is not None and proj.weight.abs().max() == 0  # starts as nothing
    with torch.no_grad():
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=torch.Generator().manual_seed(3)))
    red = m.full_edit(req, capture=True)
    assert np.abs(red.image - before).max() > 1e-2
    blue = m.full_edit(replace(req, prompt="make it blue")).image
    assert np.abs(blue - red.image)[req.mask].max() > 1e-2  # one word apart
    np.testing.assert_allclose(m.masked_edit(req, red.cache.provider()).image, red.image, atol=2e-5)
    shards = get_executor("eager", m).run_masked_edit(req, red.cache.provider(), shard_size=2)
    np.testing.assert_allclose(shards.image, red.image, atol=2e-5)
    save_model(m, tmp_path / "w")
    np.testing.assert_allclose(load_model_folder(tmp_path / "w").full_edit(req).image, red.image, atol=2e-5)
