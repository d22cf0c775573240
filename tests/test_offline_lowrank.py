"""Weighted low-rank factorisation and bit-plane quantisation of single units."""

import numpy as np
import pytest
import torch

from sakura.formats.bitplanes import dequantize, from_planes, quantize, to_planes, truncate
from sakura.offline.lowrank import row_weights, single_threaded, weighted_lowrank
from sakura.offline.synthetic import synthetic_cache


@pytest.fixture(scope="module")
def unit():
    cache, imp = synthetic_cache(num_steps=1, num_layers=1)
    return cache.k[(0, 0)], imp[(0, 0)]


def weighted_err(x, xh, s):
    x, xh, s = x.double(), xh.double(), s.double()
    return float((s[:, None] * (xh - x) ** 2).sum() / (s[:, None] * (x - x.mean(0)) ** 2).sum())


def test_q0_is_plain_svd_of_centred_matrix(unit):
    x, imp = unit
    xd = x.double()
    with single_threaded():
        u, s, vh = torch.linalg.svd(xd - xd.mean(0), full_matrices=False)
    f = weighted_lowrank(x, imp, q=0.0, max_rank=32)
    for r in (1, 8, 32):
        plain = u[:, :r] * s[:r] @ vh[:r] + xd.mean(0)
        assert torch.allclose(f.reconstruct(r).double(), plain, atol=1e-4 * float(xd.abs().max()))
    assert torch.allclose(f.sv.double(), s[:32].to(torch.float32).double(), rtol=1e-5)


def test_weighting_lowers_weighted_error_at_equal_rank(unit):
    x, imp = unit
    plain = weighted_lowrank(x, imp, q=0.0, max_rank=48)
    weighted = weighted_lowrank(x, imp, q=0.5, max_rank=48)
    for r in (4, 8, 16, 24, 32):
        assert weighted_err(x, weighted.reconstruct(r), imp) < 0.9 * weighted_err(x, plain.reconstruct(r), imp)


def test_components_ordered_and_error_monotone_in_rank(unit):
    x, imp = unit
    f = weighted_lowrank(x, imp, q=0.5, max_rank=64)
    assert torch.all(f.sv[1:] <= f.sv[:-1] + 1e-6)
    errs = [weighted_err(x, f.reconstruct(r), imp ** 0.5) for r in range(0, 65, 4)]  # the objective's weights
    assert all(b <= a + 1e-9 for a, b in zip(errs, errs[1:]))


def test_zero_importance_is_guarded(unit):
    x, imp = unit
    s = imp.clone()
    s[:100] = 0
    w = row_weights(s, len(s), 0.5)
    assert torch.isfinite(w).all() and w.min() > 0
    f = weighted_lowrank(x, s, q=1.0, max_rank=16)
    assert torch.isfinite(f.a).all() and torch.isfinite(f.b).all()
    # all-zero or missing importance means uniform weights, i.e. plain SVD
    zero = weighted_lowrank(x, torch.zeros(len(s)), q=0.5, max_rank=16).reconstruct()
    assert torch.allclose(zero, weighted_lowrank(x, None, q=0.5, max_rank=16).reconstruct())


@pytest.mark.parametrize("method", ["gram", "randomized"])
def test_fast_paths_match_full_svd(unit, method):
    x, imp = unit
    a = weighted_lowrank(x, imp, max_rank=32, method="svd").reconstruct()
    b = weighted_lowrank(x, imp, max_rank=32, method=method).reconstruct()
    assert float((a - b).norm() / (a - a.mean(0)).norm()) < (1e-9 if method == "gram" else 1e-3)
    wide = weighted_lowrank(x[:100], imp[:100], max_rank=100, method=method).reconstruct()  # n < d
    assert torch.allclose(wide, weighted_lowrank(x[:100], imp[:100], max_rank=100, method="svd").reconstruct(),
                          atol=1e-3 * float(x.abs().max()))


def test_bit_planes_roundtrip_and_centre_bound():
    rng = np.random.default_rng(0)
    m = rng.standard_normal((5, 301)) * np.array([[1], [10], [0.01], [3], [0]])  # last row all zero
    m[1, :3] *= 50  # a spiky component: the dead zone should win at low bit widths
    codes, scales, zero = quantize(m)
    planes = to_planes(codes)
    assert planes.shape == (8, 5, 38)
    for b in range(1, 9):
        prefix = from_planes(planes[:b], 301)
        assert np.array_equal(prefix, truncate(codes, b))
        centre = dequantize(prefix, scales, b)  # centre of the b-bit cell: error <= s / 2^b
        assert np.all(np.abs(centre - m) <= scales[:, None] / 2 ** b * (1 + 1e-5) + 1e-12)
        chosen = dequantize(prefix, scales, b, zero)  # dead zone where it is better: <= s / 2^(b-1)
        assert np.all(np.abs(chosen - m) <= scales[:, None] / 2 ** (b - 1) * (1 + 1e-5) + 1e-12)
        assert np.all(((chosen - m) ** 2).sum(1) <= ((centre - m) ** 2).sum(1) + 1e-12)
    assert zero[1] & 0b11  # spiky row: dead zone at 1 and 2 bits
    assert np.all(dequantize(codes, scales, 8, zero)[4] == 0)
