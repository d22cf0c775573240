"""Version-2 packs: per-group bit allocation, entropy-coded planes, one range per level (issue #18)."""

import base64
import json
import shutil

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError, chunkcodec
from sakura.formats.allocated import MEAN, MEAN_F16, MEAN_U8, AllocatedPackInfo, PrefixConfig, decode_means
from sakura.formats.bitplanes import dequantize, truncate
from sakura.formats.container import write_container
from sakura.formats.pack import PackEncoding, PackReader, decode_factors
from sakura.offline import pack_cache, quantize_factors
from sakura.offline.allocate import ChunkRef, UnitModel, exact_error, shard_table, uniform_error
from sakura.offline.compress import SHARED_TOP_SHARE, quantize_shared
from sakura.offline.lowrank import shared_lowrank, weighted_lowrank
from sakura.offline.synthetic import synthetic_cache


@pytest.fixture(scope="module")
def small():
    return synthetic_cache(num_steps=1, num_layers=2)  # n = 903, d = 256: one shard of 4 units


@pytest.fixture(scope="module")
def packs(small, tmp_path_factory):
    cache, imp = small
    folder = tmp_path_factory.mktemp("v2")
    v1 = pack_cache(folder / "v1.pack", cache, imp, max_rank=64, shard_size=2)
    v2 = pack_cache(folder / "v2.pack", cache, imp, max_rank=96, shard_size=2, layout="allocated", reference_rank=64)
    return folder, v1, v2


def shard_factors(cache, imp, info, shard, rank):
    return [quantize_factors(weighted_lowrank(cache.unit(s, l, k), imp[(s, l)], max_rank=rank), imp[(s, l)])
            for s, l, k in info.units(shard)]


def test_v2_header_levels_are_single_prefix_ranges(packs):
    _, _, v2 = packs
    assert isinstance(v2, AllocatedPackInfo) and v2.header["version"] == 2
    for shard in range(v2.num_shards):
        front = v2.frontier(shard)
        assert front and all(isinstance(c, PrefixConfig) for c in front)
        assert all(a.bytes < b.bytes and a.error > b.error for a, b in zip(front, front[1:]))
        start = v2.ranges(shard, 0)[0][0]
        for c in front:
            (rng,) = v2.ranges(shard, c.k)  # one contiguous range from the shard's mean
            assert rng == (start, c.bytes)


def test_coded_pack_decodes_bit_for_bit_to_the_quantised_factors(small, packs):
    cache, imp = small
    folder, _, v2 = packs
    reader = PackReader(folder / "v2.pack")
    coded = [v2.stored_chunk(i)[0] for i in range(len(v2.index))]
    assert any(coded) and not all(coded)  # coding paid on some planes only
    for shard in range(v2.num_shards):
        factors = shard_factors(cache, imp, v2, shard, 96)
        for c in v2.frontier(shard)[::7] + v2.frontier(shard)[-1:]:
            bits_a, bits_b = v2.allocation(shard, c.k)
            comps = np.repeat(bits_a, v2.geometry.group)[:96]
            keep = np.flatnonzero(comps > 0)
            got = decode_factors(v2, shard, c.k, reader.read(shard, c.k))
            for qf, (a, b, mean) in zip(factors, got.values()):
                ba, bb = np.repeat(bits_a, 8)[keep], np.repeat(bits_b, 8)[keep]
                want_a = np.stack([dequantize(truncate(qf.a_codes[[i]], x), qf.a_scales[[i]], x, qf.a_zero[[i]])[0]
                                   for i, x in zip(keep, ba)]) if len(keep) else np.zeros((0, v2.geometry.n))
                want_b = np.stack([dequantize(truncate(qf.b_codes[[i]], x), qf.b_scales[[i]], x, qf.b_zero[[i]])[0]
                                   for i, x in zip(keep, bb)]) if len(keep) else np.zeros((0, v2.geometry.d))
                assert np.array_equal(a.T, want_a) and np.array_equal(b, want_b)
                # the mean rides as 8-bit codes over the unit's own range: within half a step of float16's
                step = (qf.mean.astype(np.float64).max() - qf.mean.astype(np.float64).min()) / 255
                assert np.abs(mean - qf.mean.astype(np.float64)).max() <= step / 2 * (1 + 1e-5)


def test_v2_top_matches_v1_top_quality_in_fewer_bytes(small, packs):
    cache, imp = small
    _, v1, v2 = packs
    for shard in range(v2.num_shards):
        top1, top2 = v1.frontier(shard)[-1], v2.frontier(shard)[-1]
        assert top1.key == (64, 8, 8)
        assert top2.error <= top1.error * 1.01 and top2.bytes < 0.8 * top1.bytes
    assert v2.file_size < 0.8 * v1.file_size


def test_error_estimate_tracks_the_exact_metric(small, packs):
    cache, imp = small
    _, v1, _ = packs
    units = [UnitModel(cache.unit(s, l, k), imp[(s, l)], qf) for (s, l, k), qf in
             zip(v1.units(0), shard_factors(cache, imp, v1, 0, 64))]
    table, base = shard_table(units, 8)
    for groups, a, b in ((2, 3, 3), (4, 5, 4), (8, 8, 8)):
        refs = [ChunkRef(f, g, p) for g in range(groups) for f, bits in ((0, a), (1, b)) for p in range(bits)]
        exact = exact_error(units, refs, 8)
        # the estimate drops cross terms: good to ~10 %, enough to rank steps (the stop point uses the exact error)
        assert uniform_error(table, base, groups, a, b) == pytest.approx(exact, rel=0.15, abs=2e-4)
        assert exact == pytest.approx(next(c.error for c in v1.frontier(0) if c.key == (8 * groups, a, b)),
                                      rel=2e-3) if (8 * groups, a, b) in {c.key for c in v1.frontier(0)} else True


def test_truncated_coded_shard_decodes_to_the_level_its_prefix_holds(packs):
    folder, _, v2 = packs
    enc = PackEncoding(v2)
    unit = enc.units[0]
    top = unit.levels[-1]
    ranges = enc.ranges(unit, top)
    prefixes = enc.prefixes(unit, top, ranges)
    assert len(prefixes) == len(unit.levels)  # every stored level is a prefix of the top one
    reader = PackReader(folder / "v2.pack")
    blobs = [reader.file.read(*r) for r in ranges]
    for level, count in prefixes[::5]:
        got = enc.decode_prefix(unit, level, ranges[:count], blobs[:count])
        want = reader.decode(0, *level.key)
        for key in want:
            assert all(torch.equal(x, y) for x, y in zip(got[key], want[key]))
    # a byte-truncated transfer holds the largest level that fits in the bytes that arrived
    (start, total), = v2.ranges(0, top.key[0])
    cut = unit.levels[len(unit.levels) // 2].nbytes + 100
    fits = max((lv for lv in unit.levels if lv.nbytes <= cut), key=lambda lv: lv.nbytes)
    blob = {(start, cut): reader.file.read(start, cut)}
    reader.info.index.gather(v2.chunks(0, fits.key[0]), blob)  # every chunk of that level is whole
    with pytest.raises(PackFormatError):
        decode_factors(v2, 0, unit.levels[-1].key[0], blob)


def test_corrupted_coded_chunk_is_caught_by_its_crc(packs, tmp_path):
    folder, _, v2 = packs
    path = tmp_path / "bad.pack"
    shutil.copy(folder / "v2.pack", path)
    chunk = next(i for i in range(len(v2.index)) if v2.stored_chunk(i)[0])
    offset, length = v2.index.span(chunk)
    data = bytearray(path.read_bytes())
    data[offset + length // 2] ^= 0x55
    path.write_bytes(bytes(data))
    reader = PackReader(path)
    shard = next(s for s in range(v2.num_shards) if chunk in v2.chunks(s, len(v2._refs[s])))
    k = len(v2._refs[shard])
    with pytest.raises(PackFormatError, match="checksum"):
        reader.decode(shard, k)
    try:  # unchecked, a corrupt frame is refused or decodes to wrong values of the right size: never a crash
        got = decode_factors(v2, shard, k, reader.read(shard, k), verify=False)
        assert all(a.shape[0] == v2.geometry.n for a, _, _ in got.values())
    except PackFormatError:
        pass


def test_chunk_codec_rejects_bad_frames():
    raw = bytes(np.zeros(4096, np.uint8))
    stored, coded = chunkcodec.encode(raw)
    assert coded and len(stored) < 100 and chunkcodec.decode(stored, True, len(raw)) == raw
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert chunkcodec.encode(noise) == (noise, False)  # raw where coding does not pay
    for bad, length in ((stored, 100), (b"\x00" * 20, 4096), (stored[:-3], 4096)):
        with pytest.raises(PackFormatError):
            chunkcodec.decode(bad, True, length)


def test_hostile_v2_headers_rejected(packs, tmp_path):
    folder, _, _ = packs
    raw = (folder / "v2.pack").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for mutate in (lambda h: h.update(layout="!!"), lambda h: h.update(shard_chunks=[1, 1]),
                   lambda h: h.update(layout=h["layout"][4:] + h["layout"][:4])):
        h = dict(header)
        mutate(h)
        text = json.dumps(h).encode()
        text += b" " * (-len(text) % 8)
        with pytest.raises(PackFormatError):
            AllocatedPackInfo.from_bytes(len(text).to_bytes(8, "little") + text)



def test_fused_v2_rebuild_is_a_times_b_plus_mean(packs):
    # decode_shard's one batched matmul over the table-dequantised factors == A·B + μ per unit
    folder, _, v2 = packs
    reader = PackReader(folder / "v2.pack")
    for c in (v2.frontier(0)[0], v2.frontier(0)[-1]):
        blobs = reader.read(0, c.k)
        kv = reader.decode(0, c.k)
        for (step, layer, kind), (a, b, mean) in decode_factors(v2, 0, c.k, blobs).items():
            want = torch.addmm(torch.from_numpy(mean), torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(b))
            got = kv[(step, layer)][0 if kind == "k" else 1]
            assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_packs_with_float16_means_still_decode(packs, tmp_path):
    # v2 packs written before the 8-bit mean (layout kind 0x40, U × d <f2) stay readable
    folder, _, v2 = packs
    reader = PackReader(folder / "v2.pack")
    chunks = [reader.file.read(*v2.index.span(i)) for i in range(len(v2.index))]
    layout = bytearray(base64.b64decode(v2.header["layout"]))
    means = {}
    for shard in range(v2.num_shards):
        first = v2.chunks(shard, 0)[0]
        units = len(v2.units(shard))
        means[shard] = decode_means(chunks[first], MEAN_U8, units, v2.geometry.d).astype(np.float16)
        chunks[first] = means[shard].astype("<f2").tobytes()
        layout[2 * first] = MEAN | MEAN_F16
    header = {k: v for k, v in v2.header.items() if k not in ("data_length", "chunk_crc32", "chunk_lengths")}
    header["layout"] = base64.b64encode(bytes(layout)).decode("ascii")
    header["tradeoff"] = None  # the frontier's byte counts change with the mean; levels are chunk counts
    write_container(tmp_path / "f16.pack", header, chunks)
    old = PackReader(tmp_path / "f16.pack")
    assert old.info.mean_kind(0) == MEAN_F16 and v2.mean_kind(0) == MEAN_U8
    k = v2.frontier(0)[3].k
    got = decode_factors(old.info, 0, k, old.read(0, k))
    new = decode_factors(v2, 0, k, reader.read(0, k))
    for i, ((a, b, mean), (a2, b2, _)) in enumerate(zip(got.values(), new.values())):
        assert np.array_equal(a, a2) and np.array_equal(b, b2)
        assert np.array_equal(mean, means[0][i].astype(np.float32))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A shard whose four K/V units are built on the same smooth token fields (no per-unit outliers)."""
    cache, imp = synthetic_cache(num_steps=1, num_layers=2, heavy=0)
    folder = tmp_path_factory.mktemp("shared")
    v1 = pack_cache(folder / "v1.pack", cache, imp, max_rank=16, shard_size=2)
    unit = pack_cache(folder / "unit.pack", cache, imp, max_rank=32, shard_size=2, layout="allocated",
                      reference_rank=16)
    sh = pack_cache(folder / "shared.pack", cache, imp, max_rank=128, shard_size=2, layout="allocated",
                    reference_rank=16, shared_basis=True)
    return cache, imp, folder, v1, unit, sh


def test_shared_basis_stores_one_a_and_reaches_v1s_top_in_fewer_bytes(shared):
    cache, imp, folder, v1, unit, sh = shared
    assert sh.geometry.shared_basis == 1 and sh.header["shared_shards"] == [1] and sh.a_units(0) == 1
    assert unit.header.get("shared_shards") is None and unit.a_units(0) == 4
    top1, top = v1.frontier(0)[-1], sh.frontier(0)[-1]
    assert top.error <= SHARED_TOP_SHARE * top1.error * 1.01  # a shared basis stops at half v1's error
    # the units share their token structure: one A serves all four, in well under the per-unit pack's
    # bytes at the same error
    def bytes_at(info, error):
        return min(c.bytes for c in info.frontier(0) if c.error <= error)
    assert bytes_at(sh, top1.error) < 0.8 * bytes_at(unit, top1.error) < 0.8 * top1.bytes
    a_plane0 = next(i for i, ref in enumerate(sh.refs(0, len(sh._refs[0])), start=1) if ref.factor == 0)
    assert sh.stored_chunk(a_plane0)[1] == sh.geometry.group * (5 + -(-sh.geometry.n // 8))  # one unit's records


def test_shared_basis_decodes_to_the_shared_quantised_factors(shared):
    cache, imp, folder, _, _, sh = shared
    reader = PackReader(folder / "shared.pack")
    cells = [(cache.unit(s, l, k), imp[(s, l)]) for s, l, k in sh.units(0)]
    factors = quantize_shared(shared_lowrank([x for x, _ in cells], [i for _, i in cells], max_rank=128),
                              [i for _, i in cells])
    for c in sh.frontier(0)[::3] + sh.frontier(0)[-1:]:
        bits_a, bits_b = sh.allocation(0, c.k)
        keep = np.flatnonzero(np.repeat(bits_a, 8) > 0)
        got = list(decode_factors(sh, 0, c.k, reader.read(0, c.k)).values())
        for qf, (a, b, _) in zip(factors, got):
            assert np.array_equal(a, got[0][0])  # one token basis
            want_a = [dequantize(truncate(qf.a_codes[[i]], x), qf.a_scales[[i]], x, qf.a_zero[[i]])[0]
                      for i, x in zip(keep, np.repeat(bits_a, 8)[keep])]
            want_b = [dequantize(truncate(qf.b_codes[[i]], x), qf.b_scales[[i]], x, qf.b_zero[[i]])[0]
                      for i, x in zip(keep, np.repeat(bits_b, 8)[keep])]
            assert np.array_equal(a.T, np.stack(want_a)) and np.array_equal(b, np.stack(want_b))
        rebuilt = reader.decode(0, c.k)  # decode_shard's broadcast matmul
        for (a, b, mean), unit in zip(got, sh.units(0)):
            want = torch.from_numpy(a @ b + mean)
            assert torch.allclose(rebuilt[unit[:2]][0 if unit[2] == "k" else 1], want, atol=1e-4)


def test_units_without_common_token_structure_keep_their_own_basis(small, tmp_path):
    # per-unit outlier rows (the default synthetic cache): one basis cannot reach v1's top quality
    cache, imp = small
    v1 = pack_cache(tmp_path / "v1.pack", cache, imp, max_rank=64, shard_size=2)
    sh = pack_cache(tmp_path / "s.pack", cache, imp, max_rank=256, shard_size=2, layout="allocated",
                    reference_rank=64, shared_basis=True)
    assert sh.header["shared_shards"] == [0] and sh.a_units(0) == 4
    assert sh.frontier(0)[-1].error <= v1.frontier(0)[-1].error * 1.01


def test_hostile_shared_shards_rejected(shared, tmp_path):
    *_, folder, _, _, sh = shared
    raw = (folder / "shared.pack").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for mutate in (lambda h: h.update(shared_shards=[2]), lambda h: h.update(shared_shards=[1, 1]),
                   lambda h: h.update(shared_shards="1"), lambda h: h.update(shared_shards=[0]),
                   lambda h: h["geometry"].update(shared_basis=0)):
        h = json.loads(json.dumps(header))
        mutate(h)
        text = json.dumps(h).encode()
        text += b" " * (-len(text) % 8)
        with pytest.raises(PackFormatError):
            AllocatedPackInfo.from_bytes(len(text).to_bytes(8, "little") + text)


def test_an_auto_build_keeps_the_first_candidate_whose_top_is_as_good_as_v1s(tmp_path):
    """The first candidate stops at 30× v1's top error (a top surely worse than v1's): the build measures
    both tops' masked PSNR on the template's profiling requests, moves on, and keeps the next candidate
    if it reaches v1's; what it kept is in the pack's geometry and header and the build report."""
    from sakura.catalog import load_catalog
    from sakura.offline.builder import build_template

    said: list[str] = []
    report = build_template(load_catalog().get("fs-astronaut"), tmp_path, max_rank=8,
                            encodings=("sakura", "sakura-v1"), top_candidates=(("shard", 30.0), ("shard", 0.3)),
                            progress=said.append, output_weights=False)
    (basis, share, gap), second = report.top_tried
    assert (basis, share) == ("shard", 30.0) and gap < 0
    assert any(m.startswith("sakura (shard basis, top at 0.3") for m in said)
    kept = report.top_tried[1] if second[2] >= 0 else max(report.top_tried, key=lambda t: t[2])
    assert [report.top_basis, report.top_share, report.top_psnr_gap_db] == kept
    info = PackReader(tmp_path / "fs-astronaut.pack").info
    assert info.geometry.shared_basis == 1 and info.header["build"]["top_share"] == pytest.approx(report.top_share)
    assert report.storage["sakura"] == (tmp_path / "fs-astronaut.pack").stat().st_size


def test_a_rebuild_rank_caps_every_level_of_both_layouts(shared):
    """``sakura build --rebuild-rank``: rebuild work grows with the decoded rank, so no level of a capped pack
    decodes to more components; a shared basis that cannot reach its target under the cap gives way to one
    basis per unit, which still reaches v1's top quality when the cap is at least v1's rank."""
    from sakura.offline.builder import pack_options

    cache, imp, folder, v1, _, sh = shared
    free_rank = max(c.r for c in sh.frontier(0))
    cap = 24
    assert 16 <= cap < free_rank  # binds on the shared basis (16: v1's rank)
    opts = pack_options(16, "allocated", "shard", rebuild_rank=cap)
    assert opts["max_rank"] == cap and opts["reference_rank"] == 16
    assert pack_options(16, "uniform", rebuild_rank=8) == {"layout": "uniform", "max_rank": 8}
    assert pack_options(16, "allocated", "unit", rebuild_rank=1000)["max_rank"] == 32  # a loose cap changes nothing
    with pytest.raises(ValueError, match="rebuild rank"):
        pack_options(16, rebuild_rank=0)
    capped = pack_cache(folder / "capped.pack", cache, imp, shard_size=2, **opts)
    assert capped.geometry.rank <= cap and max(c.r for c in capped.frontier(0)) <= cap
    top = capped.frontier(0)[-1]
    if capped.a_units(0) == 1:  # still shared: then at its own target
        assert top.error <= SHARED_TOP_SHARE * v1.frontier(0)[-1].error * 1.01
    else:
        assert top.error <= v1.frontier(0)[-1].error * 1.01
    reader = PackReader(folder / "capped.pack")
    a, b, _ = next(iter(decode_factors(capped, 0, top.k, reader.read(0, top.k)).values()))
    assert a.shape[1] == b.shape[0] <= cap
