"""IntQ baseline encoding: real bytes, roundtrips, levels, integrity (CacheGen: test_cachegen.py)."""

import numpy as np
import pytest
import torch

from sakura.formats import PackFormatError, intq
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
