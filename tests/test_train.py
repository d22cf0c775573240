"""The training data synthesizer and the trainer (fast: tiny batches, small token windows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.model.edit_data import MASK_RANGES, MB_OPS, TASKS, EditSynth, heldout_examples, make_mask


@pytest.mark.parametrize("task", TASKS)
def test_masks_in_task_ratio_range(task):
    lo, hi = MASK_RANGES[task]
    for i in range(12):
        rng = np.random.default_rng([7, i])
        region = None if i % 2 else (16, 24, 16 + 8 * 24, 24 + 8 * 24)
        m = make_mask(task, rng, region)
        assert m.dtype == bool and m.shape == (256, 256)
        assert lo <= m.mean() <= hi, (task, m.mean())


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_examples_equal_template_outside_mask(split):
    synth = EditSynth(split)
    for i in range(9):
        e = synth.sample(np.random.default_rng([split == "train", i]), TASKS[i % 3])
        assert e.template.shape == e.target.shape == (256, 256, 3)
        assert e.template.dtype == e.target.dtype == np.float32
        assert 0.0 <= e.target.min() and e.target.max() <= 1.0
        assert np.array_equal(e.target[~e.mask], e.template[~e.mask])
        if e.task in ("fs", "vton"):
            assert e.reference is not None and e.reference.ndim == 3
        else:
            assert e.reference is None and e.prompt.strip()
        if e.op != "keep":  # an edit really changes the masked region
            assert np.abs(e.target[e.mask] - e.template[e.mask]).mean() > 1e-3


def test_edits_blend_into_the_pixels_around_the_mask():
    """At the mask's edge an edit continues the nearest pixel outside it; deep inside it is the edit."""
    from scipy import ndimage

    from sakura.model.edit_data import BAND, blend_into_context

    rng = np.random.default_rng(0)
    tpl = rng.random((256, 256, 3)).astype(np.float32)
    edited = np.ones_like(tpl)
    mask = make_mask("mb", rng)
    out = blend_into_context(edited, tpl, mask)
    assert np.array_equal(out[~mask], tpl[~mask])
    dist, idx = ndimage.distance_transform_edt(mask, return_indices=True)
    edge = dist == 1
    np.testing.assert_allclose(out[edge], (tpl[idx[0], idx[1]][edge] * (1 - 0.5 / BAND) + 0.5 / BAND), atol=1e-6)
    assert np.array_equal(out[dist > BAND + 0.5], edited[dist > BAND + 0.5])


def test_keep_reproduces_template():
    synth = EditSynth("train")
    for task in TASKS:
        e = synth.sample(np.random.default_rng(3), task, keep_prob=1.0)
        assert e.prompt == "keep" and np.array_equal(e.target, e.template)


def test_heldout_set_is_fixed_and_covers_ops():
    a, b = heldout_examples(3), heldout_examples(3)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    assert all(np.array_equal(x.target, y.target) for x, y in zip(a, b))
    ops = {x.op.split(":")[0] for x in heldout_examples(len(MB_OPS)) if x.task == "mb"}
    assert len(ops) >= 8


def _small_batch(tr, task, seed=0, side=10):
    rng = np.random.default_rng(seed)
    p = tr.codec.patch
    region = (8 * p, 8 * p, (8 + side) * p, (8 + side) * p)
    examples = [tr.synth.sample(rng, task, region=region) for _ in range(2)]
    return tr.tensors(examples, (8, 8, side), rng)


@pytest.mark.parametrize("model,task", [("sakura-tiny", "fs"), ("sakura-tiny", "mb"), ("sakura-tiny-sd3", "mb")])
def test_one_training_step(tmp_path, model, task):
    from sakura.model.train import Trainer

    torch.manual_seed(0)
    tr = Trainer(model, tmp_path, batch=2, device=torch.device("cpu"), warmup=1)
    b = _small_batch(tr, task)
    before = [p.detach().clone() for p in tr.transformer.parameters()]
    te_before = [p.detach().clone() for p in tr.text_encoder.parameters()]
    loss = tr.train_step(b)
    assert np.isfinite(loss) and 0.0 < loss < 100.0
    assert tr.step == 1
    changed = sum(not torch.equal(a, p) for a, p in zip(before, tr.transformer.parameters()))
    assert changed > 0.5 * len(before)
    assert any(not torch.equal(a, p) for a, p in zip(te_before, tr.text_encoder.parameters()))
    assert all(torch.isfinite(p).all() for p in tr.transformer.parameters())
    if model.endswith("sd3"):  # the window's position-embedding override is removed after the step
        assert "cropped_pos_embed" not in vars(tr.transformer.pos_embed)


def test_checkpoint_resume_round_trip(tmp_path):
    from sakura.model.train import Trainer

    tr = Trainer("sakura-tiny", tmp_path, batch=2, device=torch.device("cpu"), warmup=1)
    tr.train_step(_small_batch(tr, "mb", seed=1))
    tr.elapsed = 12.5
    tr.history.append((1, 12.5, 0.9))
    tr.save()
    tr2 = Trainer("sakura-tiny", tmp_path, batch=2, device=torch.device("cpu"), warmup=1)
    tr2.load()
    assert (tr2.step, tr2.elapsed, tr2.history) == (1, 12.5, [(1, 12.5, 0.9)])
    for a, b in ((tr.transformer, tr2.transformer), (tr.text_encoder, tr2.text_encoder), (tr.ema_tr, tr2.ema_tr)):
        sa, sb = a.state_dict(), b.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert tr2.opt.state_dict()["state"].keys() == tr.opt.state_dict()["state"].keys()
    # the resumed trainer continues identically: same next batch, same loss
    b1, b2 = tr.make_batch(tr.step), tr2.make_batch(tr2.step)
    assert torch.equal(b1["eps"], b2["eps"]) and b1["window"] == b2["window"]
    with torch.no_grad():
        assert float(tr.loss(b1)) == pytest.approx(float(tr2.loss(b2)), rel=1e-5)


def test_ship_round_trip_fp16(tmp_path):
    """Shipped weights are fp16 safetensors and load back as an fp32 adapter with the same weights."""
    from sakura.model.embedded import load_model_folder
    from sakura.model.train import Trainer, ship

    tr = Trainer("sakura-tiny", tmp_path / "run", batch=2, device=torch.device("cpu"), ema=0.0)
    folder = ship(tr, tmp_path / "w")
    from safetensors import safe_open

    with safe_open(str(next((folder / "transformer").glob("*.safetensors"))), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.float16
    a = load_model_folder(folder)
    assert next(a.transformer.parameters()).dtype == torch.float32
    assert next(a.text_encoder.parameters()).dtype == torch.float32
    for (k, p), q in zip(tr.transformer.state_dict().items(), a.transformer.state_dict().values()):
        assert torch.allclose(p.half().float(), q), k


def _codec(**changes):
    """The plain codec (no option on, as the first shipped model) with ``changes``: each test turns on what it is
    about (the embedded default has every option on)."""
    from dataclasses import replace

    from test_model import plain_codec

    return replace(plain_codec("sakura-tiny"), **changes)


FILL = {"blank_tasks": ("fs", "vton")}
ALIGNED_LOCAL = FILL | {"ref_mode": "aligned", "locality": (0.0, 0.25, 0.5, 1.0)}


@pytest.mark.parametrize("changes", [FILL, ALIGNED_LOCAL, ALIGNED_LOCAL | {"ref_mode": "both", "patch_context": False}])
def test_training_forward_is_the_samplers_velocity(tmp_path, changes):
    """The training objective sees exactly what the sampler feeds the model (fill-style conditioning,
    the aligned reference and the locality bias included): on the whole grid, the training
    prediction equals the adapter's velocity."""
    from sakura.model.base import EditRequest
    from sakura.model.train import Trainer

    tr = Trainer("sakura-tiny", tmp_path, batch=1, device=torch.device("cpu"), codec=_codec(**changes))
    tr.text_encoder.eval()
    rng = np.random.default_rng(3)
    e = tr.synth.sample(rng, "fs", keep_prob=0.0)
    g = tr.codec.grid
    b = tr.tensors([e], (0, 0, g), rng, t=torch.tensor([0.75]))
    a = tr.adapter
    req = EditRequest(e.template, e.mask, e.task, e.prompt or "", e.reference)
    x0, _ = a.template_tokens(req)
    cond = a.conditioning_tokens(req, x0)
    assert torch.equal(cond, b["x0"][0]) and not torch.equal(cond, x0)
    if tr.codec.ref_aligned:  # the reference is inside the mask, nowhere else
        assert b["aligned"][0][~b["tmask"][0]].abs().max() == 0 and b["aligned"][0][b["tmask"][0]].abs().max() > 0
    xt = 0.25 * b["tgt"][0] + 0.75 * b["eps"][0]
    a._mask_feat, a._aligned = b["mpx"][0], a.aligned_reference(req)
    with torch.no_grad():
        pred, _, _ = tr.predict(b)
        vel = a._velocity(xt, cond, b["tmask"][0], 0.75, a.text_encoder.encode(req.prompt), a.reference_tokens(req),
                          None)
    torch.testing.assert_close(pred[0], vel, atol=1e-4, rtol=1e-4)


def test_codec_follows_the_checkpoint(tmp_path):
    """Resuming or shipping a run without repeating its codec flags keeps its codec (fill-style, aligned
    references, locality); a flag that contradicts the checkpoint is refused, not silently applied."""
    import argparse

    from sakura.model.embedded import load_model_folder
    from sakura.model.train import Trainer, run_codec, ship

    tr = Trainer("sakura-tiny", tmp_path / "run", batch=2, device=torch.device("cpu"), codec=_codec(**ALIGNED_LOCAL))
    tr.save()
    flags = argparse.Namespace(resume=True, ship=False, blank_tasks=None, ref_mode=None, locality=None)
    codec = run_codec("sakura-tiny", flags, tmp_path / "run" / "ckpt.pt")
    assert codec == tr.codec
    again = Trainer("sakura-tiny", tmp_path / "run", batch=2, device=torch.device("cpu"), codec=codec)
    again.load()
    shipped = load_model_folder(ship(again, tmp_path / "w"))
    assert shipped.codec == tr.codec and shipped.codec.locality == (0.0, 0.25, 0.5, 1.0)
    with pytest.raises(SystemExit, match="ref-mode"):
        run_codec("sakura-tiny", argparse.Namespace(**vars(flags) | {"ref_mode": "tokens"}),
                  tmp_path / "run" / "ckpt.pt")
    with pytest.raises(ValueError, match="codec"):  # a trainer built for another codec cannot load it
        Trainer("sakura-tiny", tmp_path / "run", batch=2, device=torch.device("cpu")).load()


def test_warm_start_computes_what_the_folder_computes(tmp_path):
    """--init-from: a run whose inputs gained the aligned-reference columns starts as the folder's model."""
    from sakura.model.base import EditRequest
    from sakura.model.embedded import save_model, seeded_model
    from sakura.model.train import Trainer

    old = seeded_model("sakura-tiny", codec=_codec(**FILL), seed=5)
    save_model(old, tmp_path / "old")
    tr = Trainer("sakura-tiny", tmp_path / "run", batch=1, device=torch.device("cpu"),
                 codec=_codec(**FILL | {"ref_mode": "both"}))
    assert tr.init_from(tmp_path / "old") == []
    e = tr.synth.sample(np.random.default_rng(2), "vton", keep_prob=0.0)
    req = EditRequest(e.template, e.mask, e.task, e.prompt or "", e.reference)
    np.testing.assert_allclose(tr.inference_adapter().full_edit(req).image, old.full_edit(req).image, atol=2e-5)


def test_portable_checkpoint_resumes_a_run(tmp_path):
    """The committed checkpoint: fp16 weights (raw and EMA), int8 √v, the run's step, clock, history
    and codec; a run resumes from it through the CLI path when its folder has no ckpt.pt."""
    import argparse

    from sakura.model.portable_ckpt import load_portable, save_portable
    from sakura.model.train import Trainer, run_codec

    tr = Trainer("sakura-tiny", tmp_path / "run", batch=2, device=torch.device("cpu"), warmup=1,
                 codec=_codec(**ALIGNED_LOCAL))
    for i in range(2):
        tr.train_step(_small_batch(tr, "vton", seed=i))
        tr.history.append((tr.step, 3.0 * tr.step, 0.5))
    tr.elapsed = 6.0
    path = save_portable(tr, tmp_path / "portable.safetensors")
    full = tr.save()
    assert path.stat().st_size < 0.26 * full.stat().st_size
    flags = argparse.Namespace(resume=True, ship=False, blank_tasks=None, ref_mode=None, locality=None)
    codec = run_codec("sakura-tiny", flags, tmp_path / "elsewhere" / "ckpt.pt", path)
    assert codec == tr.codec
    again = Trainer("sakura-tiny", tmp_path / "run2", batch=2, device=torch.device("cpu"), warmup=1, codec=codec)
    load_portable(again, path)
    assert (again.step, again.elapsed, again.history) == (tr.step, tr.elapsed, tr.history)
    for a, b in ((tr.transformer, again.transformer), (tr.text_encoder, again.text_encoder)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            torch.testing.assert_close(x.half().float(), y, msg=name)
    for a, b, raw in ((tr.ema_tr, again.ema_tr, tr.transformer), (tr.ema_te, again.ema_te, tr.text_encoder)):
        for (name, x), y, r in zip(a.state_dict().items(), b.state_dict().values(), raw.state_dict().values()):
            # fp16 rounding of the raw weight plus int8 rounding of the (small) EMA difference
            assert (x - y).abs().max() <= r.abs().max() / 1024 + (x - r).abs().max() / 200 + 1e-7, name
    v0 = [s["exp_avg_sq"] for s in tr.opt.state_dict()["state"].values()]
    v1 = [s["exp_avg_sq"] for s in again.opt.state_dict()["state"].values()]
    assert len(v0) == len(v1) > 0
    for a, b in zip(v0, v1):  # √v within half an int8 step of its block's largest √v
        assert ((a.sqrt() - b.sqrt()).abs() <= a.sqrt().max() / 254 + 1e-12).all()
    loss = again.train_step(_small_batch(again, "fs", seed=5))  # and it trains on
    assert np.isfinite(loss) and again.step == tr.step + 1


def test_task_mix_is_normalised_and_checked():
    from sakura.model.train import parse_task_mix

    assert parse_task_mix("fs=1,mb=3", "sakura-tiny") == {"fs": 0.25, "mb": 0.75}
    assert parse_task_mix(None, "sakura-tiny") is None
    for bad in ("face=1", "fs=x", "fs=0,mb=0", "fs=-1,mb=2"):
        with pytest.raises(SystemExit):
            parse_task_mix(bad, "sakura-tiny")
    with pytest.raises(SystemExit):
        parse_task_mix("fs=1", "sakura-tiny-sd3")  # the SD3 model trains mb only


def test_mb_op_mix_weights_the_text_edits():
    """--mb-op-mix color=5: colour edits are drawn ~5× as often as each other op; unknown ops are refused; the
    default draw is unchanged (uniform, the same stream as before the option existed)."""
    from sakura.model.train import parse_shares

    ops = [o for o in MB_OPS if o != "keep"]
    weights = parse_shares("color=5", ops, "--mb-op-mix", normalise=False)
    assert weights == {"color": 5.0}
    synth = EditSynth("train", mb_op_weights=weights)
    drawn = [synth.sample(np.random.default_rng([4, i]), "mb", keep_prob=0.0).op.split(":")[0] for i in range(140)]
    share = drawn.count("color") / len(drawn)
    assert 0.20 < share < 0.55, share  # expected 5/14 ≈ 0.36; uniform would be 0.10
    plain = [EditSynth("train").sample(np.random.default_rng([4, i]), "mb", keep_prob=0.0).op for i in range(5)]
    assert plain == [EditSynth("train", mb_op_weights=None).sample(np.random.default_rng([4, i]), "mb",
                                                                   keep_prob=0.0).op for i in range(5)]
    with pytest.raises(ValueError, match="unknown mb ops"):
        EditSynth("train", mb_op_weights={"recolour": 2.0})
    with pytest.raises(SystemExit):
        parse_shares("recolour=2", ops, "--mb-op-mix")
