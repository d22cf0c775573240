"""CacheGen baseline: stored levels, shard-contiguous layout, tables fetched on first use, integrity."""

import json
import shutil

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError, encoding_from_header
from sakura.formats.cachegen import CacheGenEncoding, CacheGenInfo, CacheGenReader, decode_shard, write_cachegen
from sakura.offline.synthetic import synthetic_cache
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import CacheGenPolicy


@pytest.fixture(scope="module")
def small():
    cache, _ = synthetic_cache(num_steps=2, num_layers=4)
    return cache


@pytest.fixture(scope="module")
def cg(small, tmp_path_factory):
    path = tmp_path_factory.mktemp("cg") / "t.cachegen.pack"
    write_cachegen(path, small, shard_size=2, chunk_tokens=256)
    return path


def test_every_level_round_trips_within_its_quantisation_error(small, cg):
    r = CacheGenReader(cg)
    info, geo = r.info, r.info.geometry
    assert info.num_levels == 6 and info.num_chunks == 4  # 903 tokens in chunks of 256
    errs = []
    for lv in range(info.num_levels):
        out, se = r.decode(1, lv), []
        for (step, layer), kv in out.items():
            for kind, xh in zip("kv", kv):
                x = small.unit(step, layer, kind).float()
                c = geo.code_max(lv, layer, kind)
                m = x.abs().amax(dim=1, keepdim=True)  # per-token scale; f2 rounding adds ≤ 2^-11 of it
                assert torch.all((xh - x).abs() <= m / (2 * c) + m * 2e-3 + 1e-6)
                se.append(float(((xh - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()))
        errs.append(np.mean(se))
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-2
    sizes = [info.storage_bytes(lv) for lv in range(info.num_levels)]
    assert sizes == sorted(sizes) and info.storage_bytes() > sum(sizes)  # the file holds every level
    # entropy coding pays: each level is below its fixed-length code (+ f2 scales)
    for lv in range(info.num_levels):
        bits = np.mean([np.log2(2 * geo.code_max(lv, layer, kind) + 1) for layer, kind in geo.groups()])
        assert sizes[lv] < small.nbytes() / 16 * bits + small.nbytes() / geo.d


def test_a_shard_at_a_level_is_one_contiguous_range_of_its_token_chunks(cg):
    info = CacheGenReader(cg).info
    ends = []
    for s in range(info.num_shards):
        for lv in range(info.num_levels):
            spans = [info.index.span(i) for i in info.chunk_ids(s, lv)]
            assert all(o + n == spans[k + 1][0] for k, (o, n) in enumerate(spans[:-1]))
            assert info.shard_range(s, lv) == (spans[0][0], sum(n for _, n in spans))
            ends.append(info.shard_range(s, lv))
    assert all(o + n == ends[k + 1][0] for k, (o, n) in enumerate(ends[:-1]))  # file order: shard → level


def test_tables_are_fetched_and_priced_on_first_use_only(cg):
    r = CacheGenReader(cg)
    info = r.info
    raw = cg.read_bytes()
    base = encoding_from_header("cachegen", r.file.header_bytes)
    enc = base.fresh()
    u0, u1 = enc.units[0], enc.units[1]
    table = [info.table_range(lv)[1] for lv in range(info.num_levels)]
    assert [lv.nbytes for lv in enc.priced(u0).levels] == [info.shard_range(0, k)[1] + table[k] for k in range(6)]
    level = enc.priced(u0).levels[2]
    ranges = enc.ranges(u0, level)
    assert ranges == [info.table_range(2), info.shard_range(0, 2)] and sum(n for _, n in ranges) == level.nbytes
    priced = enc.priced(u1)
    assert priced.levels[2].nbytes == info.shard_range(1, 2)[1]  # level 2's tables are on their way
    assert priced.levels[3].nbytes == info.shard_range(1, 3)[1] + table[3]
    assert enc.ranges(u1, priced.levels[2]) == [info.shard_range(1, 2)]
    first = enc.decode(u0, level, [raw[o:o + n] for o, n in ranges])
    second = enc.decode(u1, priced.levels[2], [raw[o:o + n] for o, n in [info.shard_range(1, 2)]])
    for out, s in ((first, 0), (second, 1)):
        ref = r.decode(s, 2)
        assert out.keys() == ref.keys() and all(torch.equal(out[k][0], ref[k][0]) for k in out)
    # a new edit starts with no tables
    assert base.fresh().ranges(u1, priced.levels[2]) == [info.table_range(2), info.shard_range(1, 2)]
    assert enc.storage_bytes == cg.stat().st_size


def test_policy_picks_the_best_priced_level_within_the_budget(cg):
    enc = CacheGenEncoding(CacheGenReader(cg).info)
    unit = enc.priced(enc.units[0])
    policy = CacheGenPolicy(gamma=1.0)
    policy.begin(enc.units, 1.0, 1e6)
    budget = unit.levels[3].nbytes + 1
    d = policy.choose(unit, 0.0, 1.0, RuntimeMonitor(budget * 8))
    assert d.level.label == "L3" and d.fits and d.budget_bytes == pytest.approx(budget)
    d = policy.choose(unit, 0.0, 1.0, RuntimeMonitor(8.0))  # nothing fits: the smallest, not a skip
    assert d.level.label == "L0" and not d.fits


def test_corrupt_truncated_and_mismatched_bytes_raise(cg, tmp_path):
    r = CacheGenReader(cg)
    info = r.info
    with pytest.raises(PackFormatError):
        info.shard_range(0, 6)
    with pytest.raises(PackFormatError):
        info.table_range(-1)
    blobs = r.read(0, 1)
    (so, sn) = info.shard_range(0, 1)
    bad = dict(blobs)
    bad[so, sn] = blobs[so, sn][:-5]  # a truncated shard blob
    with pytest.raises(PackFormatError, match="not supplied"):
        decode_shard(info, 0, r.models(1), bad)
    enc = CacheGenEncoding(info)
    with pytest.raises(PackFormatError, match="expected 2 received ranges"):
        enc.decode(enc.units[0], enc.units[0].levels[1], [blobs[so, sn]])  # tables missing on first use
    dst = tmp_path / "bad.cachegen.pack"
    shutil.copy(cg, dst)
    raw = bytearray(dst.read_bytes())
    o, n = info.index.span(info.chunk_ids(0, 1)[2])
    raw[o + n - 3] ^= 0x40
    dst.write_bytes(bytes(raw))
    with pytest.raises(PackFormatError, match="checksum"):
        CacheGenReader(dst).decode(0, 1)
    dst.write_bytes(bytes(raw[:-10]))
    with pytest.raises(PackFormatError, match="truncated"):
        CacheGenReader(dst)


def _with_header(cg, edit) -> bytes:
    raw = cg.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text


@pytest.mark.parametrize("edit, match", [
    (lambda h: h.update(version=1), "unsupported sakura-cachegen version"),
    (lambda h: h["geometry"].update(levels=[[[2, 2, 2], [2, 2]]]), "bin counts"),
    (lambda h: h["geometry"].update(levels=h["geometry"]["levels"][:5]), "index has .* chunks"),
    (lambda h: h["geometry"].update(shard_size=1), "index has .* chunks"),
    (lambda h: h.update(shards=h["shards"][::-1]), "shard list"),
    (lambda h: h.pop("geometry"), "geometry is not a JSON object"),
    (lambda h: h["geometry"].update(num_steps=10**7), "num_steps must be an integer"),
])
def test_header_validation(cg, edit, match):
    with pytest.raises(PackFormatError, match=match):
        CacheGenInfo.from_bytes(_with_header(cg, edit))
