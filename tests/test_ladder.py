"""Pack version 3: the ladder above the allocated levels up to the FP16 values (issue #34)."""

import base64
import json
import shutil

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError, encoding_from_header
from sakura.formats.fp16 import Fp16Info, write_fp16
from sakura.formats.fp16 import decode as fp16_decode
from sakura.formats.ladder import RUNG, LadderPackInfo, decode_residual, encode_residual
from sakura.formats.pack import PackInfo, PackReader, decode_shard
from sakura.net.folder import FolderSource
from sakura.net.refs import ReferencedSource, resolving
from sakura.offline import pack_cache
from sakura.offline.ladder import add_ladder
from sakura.offline.synthetic import synthetic_cache
from sakura.online.monitor import RuntimeMonitor
from sakura.online.policies import SakuraPolicy


@pytest.fixture(scope="module")
def ladder_pack(tmp_path_factory):
    cache, imp = synthetic_cache(num_steps=2, num_layers=2)
    cache = cache.to(torch.float16)
    folder = tmp_path_factory.mktemp("ladder")
    pack_cache(folder / "t0.pack", cache, imp, max_rank=32, shard_size=2, layout="allocated", template_id="t0")
    v2_size = (folder / "t0.pack").stat().st_size
    write_fp16(folder / "t0.fp16.pack", cache, shard_size=2, template_id="t0")
    info = add_ladder(folder / "t0.pack", folder / "t0.fp16.pack", "t0.fp16", imp)
    return folder, cache, info, v2_size


def fetch_decode(folder, info, shard, key):
    source = ReferencedSource(FolderSource(folder), "t0", info.references)
    ranges = info.ranges(shard, *key)
    return PackReader(folder / "t0.pack"), dict(zip(ranges, source.fetch("t0", ranges)))


def test_the_ladder_extends_the_frontier_to_the_exact_cache(ladder_pack):
    folder, cache, info, v2_size = ladder_pack
    assert isinstance(info, LadderPackInfo) and info.version == 3
    fp16_info = Fp16Info.open(folder / "t0.fp16.pack")[1]
    for shard in range(info.num_shards):
        front = info.frontier(shard)
        rungs = [c for c in front if c.rung]
        assert [c.rung for c in rungs][-3:] == ["res7", "res8", "exact"] and len(rungs) >= 4
        assert all(a.bytes < b.bytes and a.error > b.error for a, b in zip(front, front[1:]))
        assert rungs[-1].error == 0.0 and rungs[-1].bytes == fp16_info.ranges(shard)[0][1]
        (exact,) = info.ranges(shard, *rungs[-1].key)
        assert exact[0] >= info.file_size  # the FP16 file's bytes, not this pack's
    storage = info.storage()
    assert abs(storage["pack"] - v2_size) < 4096  # the allocated chunks unchanged (the header grows a little)
    assert storage["rungs"] + storage["pack"] == info.file_size
    assert storage["fp16"] == (folder / "t0.fp16.pack").stat().st_size


def test_the_exact_rung_rebuilds_the_fp16_cache_bit_for_bit(ladder_pack):
    folder, cache, info, _ = ladder_pack
    fp16 = Fp16Info.open(folder / "t0.fp16.pack")[1]
    raw = (folder / "t0.fp16.pack").read_bytes()
    for shard in range(info.num_shards):
        key = (info.exact_k(shard),)
        _, blobs = fetch_decode(folder, info, shard, key)
        got = decode_shard(info, shard, *key, blobs)
        want = fp16_decode(fp16, shard, {r: raw[r[0]:r[0] + r[1]] for r in fp16.ranges(shard)})
        for unit in want:
            for a, b in zip(got[unit], want[unit]):
                assert torch.equal(a, b)
        for step, layer in want:
            assert torch.equal(want[(step, layer)][0], cache.unit(step, layer, "k").float())


def test_residual_rungs_approach_the_fp16_values(ladder_pack):
    folder, cache, info, _ = ladder_pack
    for shard in range(info.num_shards):
        n_alloc = info.allocated_count(shard)
        errs = []
        for p in (0, 4, 8):
            reader, blobs = fetch_decode(folder, info, shard, (n_alloc + p,))
            kv = decode_shard(info, shard, n_alloc + p, blobs)
            errs.append(max(float((x - cache.unit(s, l, kind).float()).abs().max())
                            for (s, l), pair in kv.items() for kind, x in zip("kv", pair)))
        assert errs[0] > errs[1] > errs[2]
        scale = max(float(cache.unit(s, l, k).float().abs().max()) for s, l, k in info.units(shard))
        assert errs[2] < 1e-2 * scale  # 8 residual planes: near-lossless


def test_residual_codec_bounds_the_error_by_half_a_step():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((2, 50, 16)).astype(np.float32) * rng.uniform(0.01, 3, (2, 1, 16)).astype(np.float32)
    chunks = encode_residual(r)
    step = np.abs(r).max(axis=1, keepdims=True) / 128
    for p in range(1, 9):
        got = decode_residual(chunks[:p], 2, 50, 16)
        assert np.all(np.abs(got - r) <= step * 2 ** (8 - p) / 2 * (1 + 1e-5) + 1e-7)


def rewrite(folder, tmp_path, edit):
    raw = (folder / "t0.pack").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    edit(header)
    text = json.dumps(header).encode()
    path = tmp_path / "bad.pack"
    path.write_bytes(len(text).to_bytes(8, "little") + text + body)
    return path


@pytest.mark.parametrize("edit", [
    lambda h: h["ladder"].pop("fp16"),
    lambda h: h["ladder"]["fp16"].update(base=1),  # inside the pack itself
    lambda h: h["ladder"]["fp16"].update(file_id=""),
    lambda h: h["ladder"]["fp16"]["shards"][0].__setitem__(1, 7),  # not the shard's FP16 length
    lambda h: h["ladder"]["fp16"]["shards"].pop(),
    lambda h: h["tradeoff"]["frontiers"][0][-1].__setitem__(2, 1.0),  # the exact rung worse than the top
    lambda h: h["tradeoff"]["frontiers"][0][-2].__setitem__(1, 5),  # a rung's bytes not its range
    lambda h: h.update(layout=base64.b64encode(  # a residual plane out of order
        (lambda b: b[:-2] + bytes([RUNG | 3, 0]))(base64.b64decode(h["layout"]))).decode()),
    lambda h: h.update(layout=base64.b64encode(  # a residual plane before an allocated chunk
        (lambda b: b[:2] + bytes([RUNG, 0]) + b[4:])(base64.b64decode(h["layout"]))).decode()),
])
def test_malformed_ladder_headers_are_format_errors(ladder_pack, tmp_path, edit):
    folder, *_ = ladder_pack
    path = rewrite(folder, tmp_path, edit)
    with pytest.raises(PackFormatError) as e:
        info = PackInfo.open(path)[1]
        for s in range(info.num_shards):
            info.frontier(s)
    assert "\n" not in str(e.value)


def test_truncated_or_corrupt_rung_bytes_are_format_errors(ladder_pack, tmp_path):
    folder, _, info, _ = ladder_pack
    n_alloc = info.allocated_count(0)
    reader, blobs = fetch_decode(folder, info, 0, (n_alloc + 8,))
    (rng, data), = blobs.items()
    with pytest.raises(PackFormatError):  # a rung whose last plane was cut short
        decode_shard(info, 0, n_alloc + 8, {rng: data[:-100]})
    key = (info.exact_k(0),)
    _, blobs = fetch_decode(folder, info, 0, key)
    (rng, data), = blobs.items()
    with pytest.raises(PackFormatError):  # FP16 bytes cut short
        decode_shard(info, 0, *key, {rng: data[:-2]})
    with pytest.raises(PackFormatError, match="CRC32"):  # FP16 bytes that are not the recorded file's
        decode_shard(info, 0, *key, {rng: bytes(len(data))})
    shutil.copy(folder / "t0.pack", tmp_path / "short.pack")
    with open(tmp_path / "short.pack", "r+b") as f:
        f.truncate(info.file_size - 10)
    with pytest.raises(PackFormatError):  # a pack file missing the tail of its last rung
        PackInfo.open(tmp_path / "short.pack")


def test_the_policy_climbs_the_ladder_only_when_the_budget_allows(ladder_pack):
    folder, _, info, _ = ladder_pack
    enc = encoding_from_header("sakura", PackReader(folder / "t0.pack").header_bytes)
    unit = enc.units[0]
    policy = SakuraPolicy(price_rebuild=False)
    exact = max(lv.nbytes for lv in unit.levels)
    top = max(lv.nbytes for lv in unit.levels if not lv.rung)
    fast, slow = RuntimeMonitor(8 * exact / 0.1 * 10), RuntimeMonitor(8 * top / 0.1 * 1.01)
    assert policy.choose(unit, 0.0, 0.125, fast).level.rung == "exact"
    picked = policy.choose(unit, 0.0, 0.125, slow).level
    assert not picked.rung and picked.nbytes == top


def test_a_source_resolves_the_referenced_ranges_and_passes_others(ladder_pack):
    folder, _, info, _ = ladder_pack
    enc = encoding_from_header("sakura", PackReader(folder / "t0.pack").header_bytes)
    plain = FolderSource(folder)
    assert resolving(plain, "t0.fp16", encoding_from_header("fp16", plain.header_bytes("t0.fp16"))) is plain
    source = resolving(plain, "t0", enc)
    unit = enc.units[1]
    exact = unit.levels[-1]
    (rng,) = enc.ranges(unit, exact)
    fp16 = Fp16Info.open(folder / "t0.fp16.pack")[1]
    (off, n), = fp16.ranges(1)
    assert source.fetch("t0", [rng]) == [(folder / "t0.fp16.pack").read_bytes()[off:off + n]]
    with pytest.raises(Exception):
        plain.fetch("t0", [rng])  # the pack itself has no such bytes


# -- the policy climbs the ladder on both clocks (a built template, the model's real edit) -----------------
@pytest.fixture(scope="module")
def fs_runtime(fs_packs):
    from sakura.runtime.calibration import CalibrationStore
    from sakura.runtime.session import DeviceRuntime

    packs, tpl = fs_packs
    return tpl, DeviceRuntime(FolderSource(packs), calibration=CalibrationStore(repeats=1))


def fixed(runtime, tpl, fp16_transfers_per_compute: float):
    """A fixed link on which the whole FP16 cache takes ``fp16_transfers_per_compute`` × the masked compute."""
    from sakura.net.traces import Trace
    from sakura.runtime.session import Network

    state = runtime.template_state(tpl)
    mbps = state.fp16_bytes * 8 / (fp16_transfers_per_compute * state.compute.masked_s) / 1e6
    return Network(Trace.constant(mbps), f"fixed:{mbps:.0f}", 0.0, 1.0, "none")


@pytest.mark.parametrize("clock", ["sim", "real"])
def test_the_policy_climbs_above_the_allocated_top_on_a_fast_link_only(fs_runtime, clock):
    tpl, runtime = fs_runtime
    for speed, climbs in ((0.02, True), (20.0, False)):  # FP16 in 2 % of the compute; in 20× it
        session = runtime.session(tpl, "sakura", fixed(runtime, tpl, speed), fallbacks=False)
        req = session.request(catalog_request=tpl.eval_requests[0])
        tl = (session.simulate(req) if clock == "sim" else session.run(req)).timeline
        rungs = [u.rung for u in tl.units]
        assert tl.summary()["rungs"] == rungs
        if climbs:
            assert sum(bool(r) for r in rungs) >= len(rungs) // 2, rungs
            assert all(u.level.startswith("rung ") for u in tl.units if u.rung)
        else:  # (shard 0's units may take a small rung: the start-up hold is theirs alone, and no compute waits on it)
            assert not any(u.rung for u in tl.units if u.needed_by > 0), rungs


def test_a_ladder_is_replaced_in_place_and_the_allocated_chunks_kept(ladder_pack, tmp_path):
    folder, cache, info, _ = ladder_pack
    shutil.copy(folder / "t0.pack", tmp_path / "t0.pack")
    shutil.copy(folder / "t0.fp16.pack", tmp_path / "t0.fp16.pack")
    _, imp = synthetic_cache(num_steps=2, num_layers=2)
    again = add_ladder(tmp_path / "t0.pack", tmp_path / "t0.fp16.pack", "t0.fp16", imp)
    assert (tmp_path / "t0.pack").read_bytes() == (folder / "t0.pack").read_bytes()  # deterministic, idempotent
    assert again.storage() == info.storage()
    assert any(again.stored_chunk(i)[0] for i in range(len(again.index)) if i not in again._base)  # coded planes
