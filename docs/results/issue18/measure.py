import sys, numpy as np, zstandard, zlib, time
from sakura.formats.pack import PackReader
r = PackReader(sys.argv[1]); info = r.info; g = info.geometry
print(g)
def H(p): 
    p = np.clip(p,1e-12,1-1e-12); return -(p*np.log2(p)+(1-p)*np.log2(1-p))
cz = zstandard.ZstdCompressor(level=19)
tot = {}
for s in [0, info.num_shards//2, info.num_shards-1]:
    base = info._base[s]; U = len(info.units(s))
    for f, L in ((0, g.n), (1, g.d)):
        pb = (L+7)//8
        planes = []
        for p in range(8):
            row = []
            for gi in range(g.num_groups):
                cid = base + 1 + (f*8+p)*g.num_groups + gi
                o, n = info.index.span(cid); data = np.frombuffer(r.file.read(o, n), np.uint8)
                gs = g.group_size(gi)
                rec = data.reshape(gs, U, -1)
                bits = rec[..., 5:] if p == 0 else rec
                row.append(bits)
            planes.append(row)
        for p in range(8):
            raw = ent = zs = zx = zl = 0
            for gi in range(g.num_groups):
                b = planes[p][gi]; b0 = planes[0][gi]
                x = b if p == 0 else b ^ (~b0)
                bb = np.unpackbits(x, axis=-1, count=L)
                raw += b.size; ent += H(bb.mean())*bb.size/8
                zs += len(cz.compress(b.tobytes())); zx += len(cz.compress(x.tobytes())); zl += len(zlib.compress(x.tobytes(), 9))
            k = (f, p); t = tot.setdefault(k, [0,0,0,0,0])
            for i, v in enumerate((raw, ent, zs, zx, zl)): t[i] += v
print("factor plane   raw    H(iid,xor)  zstd  zstd(xor) zlib(xor)")
for (f,p), t in sorted(tot.items()):
    print(f"{'AB'[f]} {p}  {t[0]:8d} {t[1]/t[0]:.3f} {t[2]/t[0]:.3f} {t[3]/t[0]:.3f} {t[4]/t[0]:.3f}")
