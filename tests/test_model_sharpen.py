"""Attention sharpening (sakura.model.sharpen) and the cache-sensitivity quantiser (issue 17)."""

import torch
from test_model import request

from sakura.model import seeded_model
from sakura.model.evaluate import per_token_quant
from sakura.model.sharpen import sharpen, step0_checkpoint


def test_sharpen_scales_logits_and_keeps_cache_reuse_exact():
    m = seeded_model("sakura-tiny")
    before = {n: p.clone() for n, p in m.transformer.named_parameters()}
    assert sharpen(m, 4.0) == 2 * 2 * 2 + 6 * 2  # 2 double blocks (image + text q/k) + 6 single blocks
    for n, p in m.transformer.named_parameters():
        factor = 2.0 if any(f".{k}." in n for k in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")) else 1.0
        torch.testing.assert_close(p, before[n] * factor)
    req = request("mb")
    full = m.full_edit(m.self_conditioned(req), capture=True)
    masked = m.masked_edit(m.self_conditioned(req), full.cache.provider())
    assert abs(masked.image - full.image).max() < 2e-5


def test_step0_checkpoint_warm_starts_training(tmp_path):
    from sakura.model.train import Trainer

    m = seeded_model("sakura-tiny")
    sharpen(m, 2.0)
    step0_checkpoint(m, "sakura-tiny", tmp_path)
    tr = Trainer("sakura-tiny", tmp_path, device=torch.device("cpu"))
    tr.load()
    assert tr.step == 0
    for src in (tr.transformer, tr.ema_tr):
        for (n, p), q in zip(src.state_dict().items(), m.transformer.state_dict().values()):
            torch.testing.assert_close(p, q, msg=n)


def test_per_token_quant_is_per_token():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 16, generator=g) * torch.linspace(0.1, 10, 50)[:, None]  # rows of very different range
    for bits in (2, 4):
        y = per_token_quant(x, bits)
        step = (x.amax(1) - x.amin(1)) / (2**bits - 1)
        assert ((y - x).abs().amax(1) <= step * 0.5 + 1e-2 * step + 1e-3).all()
    x[3] = 1.5  # a constant token is exact
    assert torch.equal(per_token_quant(x, 2)[3], x[3])


def test_cache_sensitivity_orders_degradations():
    """INT4 closer to the exact cache than INT2, a zeroed cache further still; every field the model
    card reports (a full local run included)."""
    from test_model import sharpened

    from sakura.model import EditRequest
    from sakura.model.evaluate import cache_sensitivity

    m = sharpened("sakura-tiny")
    req = request("mb")
    base = EditRequest(req.template, req.mask, "mb", "", None, seed=req.seed)
    other = req.template[::-1].copy()
    out = cache_sensitivity(m, base, [req], [req], other)
    assert set(out) == {"zeroed", "int2", "int4", "other", "local_no_cache", "int2_top_decile_error_share",
                        "requests"}
    assert out["int4"] > out["int2"] > out["zeroed"] and out["int4"] < 100
    assert 0.0 < out["int2_top_decile_error_share"] < 1.0
