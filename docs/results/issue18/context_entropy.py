"""Ideal sizes of context-modelled bit-plane coding vs zstd, per (factor, plane), on a v2 pack (every 5th shard,
all stored planes): iid per chunk, context = magnitude of the higher planes (pooled per chunk), and per row + context
with 8 bits per used probability. Usage: context_entropy.py PACK."""
import sys, numpy as np, zstandard
from sakura.formats.pack import PackReader
from sakura.formats import allocated as al
from sakura.formats.bitplanes import HEAD_BYTES, plane_bytes
def H(p):
    p = np.clip(p, 1e-9, 1 - 1e-9); return -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
def cost(bits, ctx, nctx, axis_rows=None):
    """ideal bits of coding `bits` with a static per-context prob (pooled over the chunk)."""
    tot = 0.0
    for c in range(nctx):
        m = ctx == c; n = m.sum()
        if n: tot += n * H(bits[m].mean())
    return tot
v2 = PackReader(sys.argv[1]); info = v2.info; geo = info.geometry
res = {}
for shard in range(0, info.num_shards, 5):
    k = len(info._refs[shard])
    units, means, planes, groups = al.received_planes(info, shard, k, v2.read(shard, k))
    U = len(units)
    for f, L in ((0, geo.n), (1, geo.d)):
        for g in groups:
            pl = planes[f][g]; size = geo.group_size(g); pb = plane_bytes(L)
            p0 = np.frombuffer(pl[0], np.uint8).reshape(size, U, HEAD_BYTES + pb)[..., HEAD_BYTES:]
            bits = [np.unpackbits(p0, axis=-1, count=L)] + [np.unpackbits(np.frombuffer(p, np.uint8).reshape(size, U, pb), axis=-1, count=L) for p in pl[1:]]
            mag = np.zeros_like(bits[0], dtype=np.int64)
            for p in range(1, len(bits)):
                raw = size * U * L
                key = (f, p); r = res.setdefault(key, np.zeros(5))
                r[0] += raw
                r[1] += 8 * len(zstandard.ZstdCompressor(level=12).compress(np.packbits(bits[p]).tobytes()))
                r[2] += cost(bits[p], np.zeros_like(mag), 1)  # iid per chunk
                ctx = np.minimum(mag, 7)
                r[3] += cost(bits[p], ctx, 8)  # context = magnitude prefix (capped), pooled
                # per row (component, unit) iid prob + prefix ctx: cost incl. 8 bits per (row, ctx) used
                rowid = np.arange(size * U).reshape(size, U, 1) * 8 + ctx
                rc = 0.0
                ids, inv = np.unique(rowid, return_inverse=True)
                ones = np.bincount(inv.ravel(), weights=bits[p].ravel()); cnt = np.bincount(inv.ravel())
                rc = float((cnt * H(ones / cnt)).sum()) + 8 * len(ids)
                r[4] += rc
                mag = (mag << 1) | bits[p]
print("factor plane: zstd/raw  iid/raw  ctx/raw  row+ctx(+8b/ctx)/raw")
for (f, p), r in sorted(res.items()):
    print("AB"[f], p, " ".join("%.3f" % (x / r[0]) for x in r[1:]), int(r[0] / 8))
