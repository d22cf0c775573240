"""Reconstruction backends: OpenCL rebuild == torch rebuild (decode_shard), incl. partial bit planes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError
from sakura.formats.allocated import received_planes
from sakura.formats.groupdequant import group_codes
from sakura.formats.pack import PackReader, decode_factors, decode_shard, shard_bytes
from sakura.offline.compress import pack_cache
from sakura.offline.synthetic import synthetic_cache
from sakura.runtime.reconstruct import BackendUnavailable, default_reconstructor, get_reconstructor

RANK = 32
# (r, b_A, b_B): full, mid, 1-bit planes, odd bit counts, means only, asymmetric, rank = stored rank
CONFIGS = [(RANK, 8, 8), (16, 4, 4), (8, 1, 3), (24, 2, 7), (0, 1, 1), (RANK, 5, 1), (8, 8, 2), (16, 3, 6)]
TOL = 1e-5  # K/V max abs difference (the factors themselves are bit-identical)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    cache, imp = synthetic_cache(num_steps=2, num_layers=2, seed=3)  # importance → spiky components, dead zones
    path = tmp_path_factory.mktemp("packs") / "t.pack"
    pack_cache(path, cache, imp, max_rank=RANK, shard_size=1, tradeoff=False)
    return PackReader(path)


@pytest.fixture(scope="module")
def opencl():
    try:
        rec = get_reconstructor("opencl")
    except BackendUnavailable as e:
        pytest.skip(f"no usable OpenCL device here: {e}")
    return rec


def test_pack_exercises_dead_zones(pack):
    sb = shard_bytes(pack.info, 0, RANK, 8, 8, pack.read(0, RANK, 8, 8))
    recs = np.frombuffer(sb.a.raw, np.uint8, count=RANK * len(sb.units) * (5 + sb.a.pb)).reshape(
        RANK, len(sb.units), -1
    )
    assert (recs[..., 4] != 0).any()


def test_torch_reconstructor_is_decode_shard(pack):
    rec = get_reconstructor("torch")
    blobs = pack.read(1, 16, 4, 4)
    got, want = rec.rebuild(pack.info, 1, 16, 4, 4, blobs), decode_shard(pack.info, 1, 16, 4, 4, blobs)
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key][0], want[key][0]) and torch.equal(got[key][1], want[key][1])


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "r{}-a{}-b{}".format(*c))
def test_opencl_rebuild_equals_torch(pack, opencl, cfg):
    for shard in range(pack.info.num_shards):
        blobs = pack.read(shard, *cfg)
        want = decode_shard(pack.info, shard, *cfg, blobs)
        got = opencl.rebuild(pack.info, shard, *cfg, blobs)
        assert got.keys() == want.keys()
        for key, (k, v) in want.items():
            assert got[key][0].shape == k.shape and got[key][0].dtype == torch.float32
            assert float((got[key][0] - k).abs().max()) <= TOL
            assert float((got[key][1] - v).abs().max()) <= TOL
        if cfg[0]:  # the dequantised factors are bit-identical to the numpy decoder's
            units, a, b, _ = opencl.factors(pack.info, shard, *cfg, blobs)
            ref = decode_factors(pack.info, shard, *cfg, blobs)
            for i, u in enumerate(units):
                assert np.array_equal(a[i], ref[u][0]) and np.array_equal(b[i], ref[u][1])


def test_opencl_matmul_kernel_and_merged_blobs(pack, opencl):
    from sakura.runtime.reconstruct.opencl import OpenCLReconstructor

    on_device = OpenCLReconstructor(matmul="opencl")
    whole = {(0, pack.info.file_size): pack.file.read(0, pack.info.file_size)}  # one blob covering every range
    want = decode_shard(pack.info, 1, 24, 3, 5, whole)
    for rec in (opencl, on_device):
        got = rec.rebuild(pack.info, 1, 24, 3, 5, whole)
        for key, (k, v) in want.items():
            assert float((got[key][0] - k).abs().max()) <= 1e-4 and float((got[key][1] - v).abs().max()) <= 1e-4


def test_opencl_checks_crc(pack, opencl):
    blobs = pack.read(0, 16, 2, 2)
    (off, n), data = next(iter(blobs.items()))
    bad = bytearray(data)
    bad[n // 2] ^= 0xFF
    with pytest.raises(PackFormatError, match="checksum"):
        opencl.rebuild(
            pack.info, 0, 16, 2, 2, {(off, n): bytes(bad), **{k: v for k, v in blobs.items() if k != (off, n)}}
        )


def test_unknown_platform_is_a_clear_error():
    try:
        import pyopencl  # noqa: F401
    except ImportError:
        pytest.skip("pyopencl not installed")
    with pytest.raises(BackendUnavailable, match="no-such-platform"):
        get_reconstructor("opencl", platform="no-such-platform")
    with pytest.raises(ValueError, match="unknown reconstructor"):
        get_reconstructor("cuda")


def test_default_reconstructor(monkeypatch, tmp_path):
    import sakura.runtime.reconstruct as R

    monkeypatch.setenv("SAKURA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(R, "_default", None)
    monkeypatch.setenv("SAKURA_RECONSTRUCTOR", "torch")
    assert default_reconstructor().name == "torch"
    monkeypatch.setattr(R, "_default", None)
    monkeypatch.delenv("SAKURA_RECONSTRUCTOR")
    rec = default_reconstructor()  # measured: the fastest usable backend, torch when OpenCL is missing
    assert rec.name in ("torch", "opencl")
    report = R.default_report()
    assert report["chosen"] == rec.name and "torch" in report["seconds"] and not report["cached"]
    assert default_reconstructor() is rec  # measured once per process
    monkeypatch.setattr(R, "_default", None)  # a new process: the choice comes from disk, no re-measure
    monkeypatch.setattr(R, "measure", lambda *a, **k: pytest.fail("measured again"))
    assert default_reconstructor().name == rec.name and R.default_report()["cached"]


def test_bench_device_smoke(tmp_path):
    """The benchmark end to end on its cheapest path (eager execution, torch + whatever OpenCL exists)."""
    from sakura.cli.bench_device import print_report
    from sakura.eval.device_bench import bench_device

    report = bench_device("fs-astronaut", shard_size=4, max_rank=16, configs=["R,2,2", "8,1,1"],
                          executors=("eager",), reconstructors=("torch", "opencl"), repeats=1, random_cache=True,
                          log=lambda m: None)
    assert report["pack"]["rank"] == 16 and report["configs"] == [[16, 2, 2], [8, 1, 1]]
    assert len(report["shards"]) == report["pack"]["shards"] == 4 * 2
    row = report["shards"][0]
    assert row["bytes"]["r8-a1-b1"] < row["bytes"]["r16-a2-b2"]
    assert row["execute_ms"]["eager"] > 0 and row["rebuild_ms"]["torch"]["r8-a1-b1"] > 0
    s = report["summary"]
    assert 0 <= s["hidden_share"]["torch/eager"] <= 1 and s["pipelined"]["torch/eager"]["wall_ms"] > 0
    print_report(report)


@pytest.mark.parametrize("shared", [False, True], ids=["unit-basis", "shared-basis"])
def test_opencl_rebuild_of_a_v2_pack_level_matches_torch(opencl, tmp_path, shared):
    # v2 (sakura.formats.allocated): per-group plane counts, coded chunks; one launch per bit class;
    # with a shared basis one A (one launch over a single unit) serves the shard's K and V
    cache, imp = synthetic_cache(num_steps=1, num_layers=1, seed=3, heavy=0 if shared else 24)
    path = tmp_path / "v2.pack"
    pack_cache(path, cache, imp, max_rank=RANK * (2 if shared else 1), shard_size=1, layout="allocated",
               reference_rank=RANK // 2, shared_basis=shared)
    reader = PackReader(path)
    geo = reader.info.geometry
    assert reader.info.a_units(0) == (1 if shared else 2) and geo.n % 8  # rows end in a partial byte
    dead = 0
    for c in reader.frontier(0)[::5] + reader.frontier(0)[-1:]:
        blobs = reader.read(0, c.k)
        got, want = opencl.rebuild(reader.info, 0, c.k, blobs), reader.decode(0, c.k)
        assert set(got) == set(want)
        for key in want:
            for x, y in zip(got[key], want[key]):
                assert (x - y).abs().max().item() < TOL
        # the factors bit for bit (the float8 kernel: dead zones, each row's partial last byte, n = 903);
        # a shared A is dequantised once, as one (1, n, r) factor
        units, a, b, means = opencl.factors(reader.info, 0, c.k, blobs)
        assert a.shape[0] == reader.info.a_units(0)
        for i, (wa, wb, wm) in enumerate(decode_factors(reader.info, 0, c.k, blobs).values()):
            assert np.array_equal(a[i % len(a)], wa) and np.array_equal(b[i], wb) and np.array_equal(means[i], wm)
        _, _, planes, groups = received_planes(reader.info, 0, c.k, blobs)
        for f, (length, n_units) in enumerate(((geo.n, reader.info.a_units(0)), (geo.d, len(units)))):
            _, nbits, _, zero = group_codes(planes[f], groups, geo, length, n_units)
            dead += int(((zero >> (nbits - 1)[:, None].astype(np.uint8)) & 1).sum())
    assert dead  # some components' dead zones were decoded
