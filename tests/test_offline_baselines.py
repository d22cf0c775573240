"""IntQ and CacheGen baseline encodings: real bytes, roundtrips, levels, integrity."""

import shutil

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError, cachegen, intq
from sakura.formats.cachegen import CacheGenInfo, CacheGenReader, write_cachegen
from sakura.formats.intq import IntQInfo, IntQReader, decode_unit, encode_unit, unit_bytes, write_intq
from sakura.offline.synthetic import synthetic_cache


@pytest.fixture(scope="module")
def small():
    return synthetic_cache(num_steps=2, num_layers=4)


def rel_err(out, cache):
    errs = []
    for key, (k, v) in out.items():
        for x, xh in ((cache.k[key], k), (cache.v[key], v)):
            x, xh = x.double(), xh.double()
            errs.append(float(((xh - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()))
    return float(np.mean(errs))


def test_intq_unit_roundtrip(small):
    cache, _ = small
    x = cache.v[(1, 2)]
    errs = []
    for bits in (2, 3, 4, 8):
        buf = encode_unit(x, bits)
        assert len(buf) == unit_bytes(*x.shape, bits) == 4 * 256 + (903 * 256 * bits + 7) // 8
        xh = decode_unit(buf, *x.shape, bits)
        errs.append(float((xh - x.float()).norm()))
        # per-channel cell half-width bounds the error (plus fp16 rounding of min and scale)
        span = (x.float().max(0).values - x.float().min(0).values) / (2 ** bits - 1)
        assert torch.all((xh - x.float()).abs() <= span * 0.5 + 2e-3 * x.float().abs().max() + 1e-6)
    assert errs == sorted(errs, reverse=True)


def test_intq_file(small, tmp_path):
    cache, _ = small
    info = write_intq(tmp_path / "t.intq", cache, shard_size=2)
    r = IntQReader(tmp_path / "t.intq")
    assert info.storage_bytes(3) == 16 * unit_bytes(903, 256, 3)  # 16 units, 3 bits per value + f2 min/scale
    assert info.storage_bytes() > sum(info.storage_bytes(b) for b in (2, 3, 4, 8))
    errs = [rel_err(r.decode(1, b), cache) for b in (2, 3, 4, 8)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 1e-3
    hdr = IntQInfo.from_bytes(r.file.header_bytes)
    blobs = r.read(3, 4)
    assert len(blobs) == 1
    out = intq.decode(hdr, 3, 4, blobs)
    assert torch.equal(out[(1, 3)][0], r.decode(3, 4)[(1, 3)][0])
    raw = bytearray((tmp_path / "t.intq").read_bytes())
    (o, n), = hdr.ranges(3, 4)
    raw[o + 5] ^= 1
    (tmp_path / "t.intq").write_bytes(bytes(raw))
    with pytest.raises(PackFormatError, match="checksum"):
        IntQReader(tmp_path / "t.intq").decode(3, 4)
    with pytest.raises(PackFormatError):
        r.info.ranges(0, 5)


@pytest.fixture(scope="module")
def cg(small, tmp_path_factory):
    cache, _ = small
    path = tmp_path_factory.mktemp("cg") / "t.cachegen"
    write_cachegen(path, cache, shard_size=2, chunk_tokens=256)
    return path


def test_cachegen_levels(small, cg):
    cache, _ = small
    r = CacheGenReader(cg)
    info = r.info
    assert info.num_levels == 3 and info.num_chunks == 4  # 903 tokens in chunks of 256
    errs = [rel_err(r.decode(2, [lv] * 4), cache) for lv in range(3)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.01
    sizes = [info.storage_bytes(lv) for lv in range(3)]
    assert sizes == sorted(sizes)
    assert info.storage_bytes() > sum(sizes) - 1 and info.storage_bytes() > 2 * sizes[-1]
    # entropy coding really compresses: level 1 is below its fixed-length code size
    fixed_bits = np.mean([np.log2(2 * (info.geometry.bins(1, l, k) // 2 - 1) + 1) for l in range(4) for k in "kv"])
    assert sizes[1] < cache.nbytes() / 16 * fixed_bits


def test_cachegen_mixed_levels_from_received_bytes(small, cg):
    cache, _ = small
    r = CacheGenReader(cg)
    levels = [0, 2, 1, 2]
    blobs = r.read(1, levels)
    assert len(blobs) == 3 + 4  # three models + one range per chunk
    info = CacheGenInfo.from_bytes(r.file.header_bytes)
    out = cachegen.decode(info, 1, levels, blobs)
    for c, lv in enumerate(levels):
        ref = r.decode(1, [lv] * 4)
        t0, t1 = info.geometry.token_chunks()[c]
        for key in out:
            assert torch.equal(out[key][0][t0:t1], ref[key][0][t0:t1])
            assert torch.equal(out[key][1][t0:t1], ref[key][1][t0:t1])


def test_cachegen_anchor_delta_roundtrip(small, tmp_path):
    cache, _ = small
    write_cachegen(tmp_path / "a.cg", cache, shard_size=4, chunk_tokens=300, anchor_group=10)
    r = CacheGenReader(tmp_path / "a.cg")
    errs = [rel_err(r.decode(0, [lv] * r.info.num_chunks), cache) for lv in range(3)]
    assert errs == sorted(errs, reverse=True) and errs[-1] < 0.01


def test_cachegen_corruption_and_bad_requests(cg, tmp_path):
    r = CacheGenReader(cg)
    with pytest.raises(PackFormatError):
        r.info.ranges(0, 4, 0)
    with pytest.raises(PackFormatError):
        r.decode(0, [0, 0])
    dst = tmp_path / "bad.cachegen"
    shutil.copy(cg, dst)
    (o, n), = r.info.ranges(0, 1, 1)
    raw = bytearray(dst.read_bytes())
    raw[o + n - 3] ^= 0x40
    dst.write_bytes(bytes(raw))
    with pytest.raises(PackFormatError, match="checksum"):
        CacheGenReader(dst).decode(0, [1, 1, 1, 1])
    dst.write_bytes(bytes(raw[:-10]))
    with pytest.raises(PackFormatError, match="truncated"):
        CacheGenReader(dst)
