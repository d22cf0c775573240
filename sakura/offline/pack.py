"""The progressive SAKURA pack: one file per template serving every (shard, r, b_A, b_B) as a prefix.

Chunk order (see docs/pack-format.md for the byte-level spec). For each shard, with U units
(layer-major, K then V) and components in groups of G (``group``):

    mean                           U × d float16 — always sent
    A plane 0, group 0 .. ng−1     per component j, per unit u: scale (f32), zero (u8), ⌈n/8⌉ bytes
    A plane 1 .. 7, group 0 .. ng−1  per component j, per unit u: ⌈n/8⌉ bytes
    B plane 0 .. 7, group 0 .. ng−1  same with d (plane 0 again carries scale and zero)

Components are contiguous inside a plane, so configuration (r, b_A, b_B) is the mean plus, for each
of the first b planes of a factor, the first ⌈r/G⌉ group chunks — one contiguous byte range per
plane. The mean touches A plane 0, so a configuration is ``b_A + b_B`` ranges (one when r = R and
both factors are at 8 bits), fetched with one multi-range HTTP request. r must be a multiple of G
(or the stored rank R, or 0 = mean only) so that every chunk received is whole and CRC-checkable.
"""

from __future__ import annotations

import functools
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from sakura.kvcache import KVCache, shard_plan
from sakura.offline.container import (ByteSource, ContainerFile, PackFormatError, coalesce, header_size,
                                      parse_header, write_container)
from sakura.offline.lowrank import SMALL_UNIT, single_threaded, weighted_lowrank
from sakura.offline.quant import (PLANES, QuantizedFactors, dequantize, from_planes, plane_bytes, quantize_factors,
                                  to_planes)
from sakura.offline.tradeoff import DEFAULT_BITS, Config, pareto, profile_shard, rank_grid

FORMAT = "sakura-pack"
VERSION = 1
SUPPORTED_VERSIONS = (1,)
DEFAULT_GROUP = 8
HEAD_BYTES = 5  # per (component, unit, factor) in plane 0: float32 scale + u8 dead-zone bits
KINDS = ("k", "v")
QUALITY_METRIC = "mean over units of sum_j s_j*|xhat_j-x_j|^2 / sum_j s_j*|x_j-mean(x)|^2, s = importance (mean 1)"

UnitId = tuple[int, int, str]  # (step, layer, "k" | "v")
KVShard = dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]  # (step, layer) -> (K, V), each (n, d)


@dataclass(frozen=True)
class Geometry:
    num_steps: int
    num_layers: int
    heads: int
    head_dim: int
    n: int  # reusable tokens
    shard_size: int  # layers per shard
    max_rank: int  # requested
    rank: int  # stored: min(max_rank, n, d)
    group: int  # components per chunk
    planes: int = PLANES

    @property
    def d(self) -> int:
        return self.heads * self.head_dim

    @property
    def num_groups(self) -> int:
        return -(-self.rank // self.group)

    def shards(self) -> list[tuple[int, int, int]]:
        return shard_plan(self.num_steps, self.num_layers, self.shard_size)

    def group_size(self, g: int) -> int:
        return min(self.group, self.rank - g * self.group)

    def chunk_lengths(self, units: int) -> list[int]:
        """Lengths of one shard's chunks, in file order (mean, A planes × groups, B planes × groups)."""
        out = [units * self.d * 2]
        for length in (self.n, self.d):
            for p in range(self.planes):
                rec = plane_bytes(length) + (HEAD_BYTES if p == 0 else 0)
                out += [self.group_size(g) * units * rec for g in range(self.num_groups)]
        return out

    def config_bytes(self, units: int, r: int, b_a: int, b_b: int) -> int:
        """Bytes on the wire for a configuration of a shard of ``units`` units (formula, any r)."""
        if r == 0:
            return units * self.d * 2
        a = r * units * (b_a * plane_bytes(self.n) + HEAD_BYTES)
        b = r * units * (b_b * plane_bytes(self.d) + HEAD_BYTES)
        return units * self.d * 2 + a + b


def shard_units(step: int, l0: int, l1: int) -> list[UnitId]:
    return [(step, layer, kind) for layer in range(l0, l1) for kind in KINDS]


class PackInfo:
    """Everything a client needs, parsed from the header bytes alone: geometry, ranges, frontiers."""

    def __init__(self, header: dict[str, Any], index):
        self.header, self.index = header, index
        try:
            self.geometry = Geometry(**header["geometry"])
            self.shards = [tuple(s) for s in header["shards"]]
        except (KeyError, TypeError) as e:
            raise PackFormatError(f"header geometry is invalid: {e}") from None
        if self.shards != self.geometry.shards():
            raise PackFormatError("shard list does not match the geometry")
        # The layout is regular: check the stored index against the formula once, then trust it.
        expected, self._base = [], []
        for step, l0, l1 in self.shards:
            self._base.append(len(expected))
            expected += self.geometry.chunk_lengths(2 * (l1 - l0))
        if list(self.index.lengths) != expected:
            raise PackFormatError("chunk index does not match the geometry (corrupt or foreign header)")

    @classmethod
    def from_bytes(cls, buf: bytes) -> "PackInfo":
        """From the file's first :func:`header_size` bytes (more is fine)."""
        return cls(*parse_header(buf, FORMAT, SUPPORTED_VERSIONS))

    header_size = staticmethod(header_size)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def file_size(self) -> int:
        return self.index.file_size

    @property
    def model_id(self) -> str:
        return self.header.get("model_id", "")

    @property
    def template_id(self) -> str:
        return self.header.get("template_id", "")

    def units(self, shard: int) -> list[UnitId]:
        return shard_units(*self.shards[shard])

    def validate(self, shard: int, r: int, b_a: int, b_b: int) -> None:
        g = self.geometry
        if not 0 <= shard < self.num_shards:
            raise PackFormatError(f"shard {shard} out of range (pack has {self.num_shards})")
        if not 0 <= r <= g.rank or (r % g.group and r != g.rank):
            raise PackFormatError(f"rank {r} invalid: use 0..{g.rank} in steps of {g.group} (or {g.rank})")
        if r and not (1 <= b_a <= g.planes and 1 <= b_b <= g.planes):
            raise PackFormatError(f"bits ({b_a}, {b_b}) out of range 1..{g.planes}")

    def chunks(self, shard: int, r: int, b_a: int, b_b: int) -> list[int]:
        """Chunk ids of a configuration, in file order."""
        self.validate(shard, r, b_a, b_b)
        g, base = self.geometry, self._base[shard]
        out = [base]
        if r:
            groups = -(-r // g.group)
            for f, bits in enumerate((b_a, b_b)):
                for p in range(bits):
                    first = base + 1 + (f * g.planes + p) * g.num_groups
                    out += range(first, first + groups)
        return out

    def ranges(self, shard: int, r: int, b_a: int, b_b: int) -> list[tuple[int, int]]:
        """Absolute ``(offset, length)`` byte ranges of a configuration, merged where they touch."""
        return coalesce([self.index.span(i) for i in self.chunks(shard, r, b_a, b_b)])

    def config_bytes(self, shard: int, r: int, b_a: int, b_b: int) -> int:
        return sum(n for _, n in self.ranges(shard, r, b_a, b_b))

    def frontier(self, shard: int) -> list[Config]:
        table = self.header.get("tradeoff") or {}
        rows = table.get("frontiers") or []
        return [Config.from_list(c) for c in rows[shard]] if shard < len(rows) else []


# ---------------------------------------------------------------------------------------------- write


def _encode_shard(qfs: Sequence[QuantizedFactors], geo: Geometry) -> list[bytes]:
    """One shard's chunks in file order from its units' quantised factors."""
    chunks = [np.stack([qf.mean for qf in qfs]).astype("<f2").tobytes()]
    for codes, scales, zero in (([qf.a_codes for qf in qfs], [qf.a_scales for qf in qfs], [qf.a_zero for qf in qfs]),
                                ([qf.b_codes for qf in qfs], [qf.b_scales for qf in qfs], [qf.b_zero for qf in qfs])):
        planes = to_planes(np.stack(codes, axis=1))  # (8, R, U, ⌈L/8⌉): component-major, then unit
        head = np.concatenate([np.stack(scales, axis=1).astype("<f4")[..., None].view(np.uint8),
                               np.stack(zero, axis=1)[..., None]], axis=-1)  # (R, U, 5)
        for p in range(geo.planes):
            recs = np.concatenate([head, planes[0]], axis=-1) if p == 0 else planes[p]
            for g in range(geo.num_groups):
                chunks.append(np.ascontiguousarray(recs[g * geo.group:(g + 1) * geo.group]).tobytes())
    return chunks


def write_pack(path: str | Path, cache: KVCache, importance: Mapping[tuple[int, int], torch.Tensor] | None, *,
               q: float = 0.5, max_rank: int = 64, shard_size: int = 1, model_id: str = "", template_id: str = "",
               tradeoff: Mapping[int, Sequence[Config]] | bool | None = None, group: int = DEFAULT_GROUP,
               bits: Sequence[int] = DEFAULT_BITS,
               progress: Callable[[int, int], None] | None = None) -> PackInfo:
    """Factorise, quantise and write one template's pack; returns its parsed header.

    ``importance[(step, layer)]`` is the (n,) token importance for both K and V of that unit (missing
    → uniform). ``tradeoff``: None profiles the frontier here (weighted error on a rank × ``bits``
    grid); a mapping ``shard → configs`` stores a frontier computed elsewhere (e.g. from image
    PSNR); False stores none. ``progress(done, total)`` is called after each shard.
    """
    importance = importance or {}
    n, d = cache.num_reused, cache.dim
    geo = Geometry(cache.num_steps, cache.num_layers, cache.heads, cache.head_dim, n, shard_size, max_rank,
                   min(max_rank, n, d), group)
    if geo.rank < 1:
        raise ValueError("nothing to store: rank would be 0")
    t0 = time.perf_counter()
    chunks: list[bytes] = []
    frontiers: list[list[Config]] = []
    ranks = rank_grid(geo.rank, group)
    plan = geo.shards()
    with single_threaded(n * d <= SMALL_UNIT):
        for i, (step, l0, l1) in enumerate(plan):
            units = []
            for s, layer, kind in shard_units(step, l0, l1):
                x = (cache.k if kind == "k" else cache.v)[(s, layer)]
                imp = importance.get((s, layer))
                units.append((x, imp, quantize_factors(weighted_lowrank(x, imp, q=q, max_rank=max_rank), imp)))
            chunks += _encode_shard([qf for _, _, qf in units], geo)
            if tradeoff is None:
                nbytes = functools.partial(geo.config_bytes, len(units))
                frontiers.append(pareto(profile_shard(units, nbytes, ranks, bits)))
            if progress:
                progress(i + 1, len(plan))
    if isinstance(tradeoff, Mapping):
        frontiers = [list(tradeoff.get(i, [])) for i in range(len(plan))]
    header: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
        "geometry": asdict(geo),
        "dtypes": {"source": str(next(iter(cache.k.values())).dtype).removeprefix("torch."),
                   "mean": "<f2", "scale": "<f4", "zero": "u8 dead-zone bit per prefix length",
                   "code": "u8 offset-binary, bit planes MSB first", "reconstruct": "centre"},
        "build": {"q": q, "importance": bool(importance), "seconds": round(time.perf_counter() - t0, 3)},
        "reuse_index_crc32": zlib.crc32(cache.reuse_index.to(torch.int64).numpy().astype("<i8").tobytes()),
        "shards": [list(s) for s in plan],
    }
    if tradeoff is not False:
        header["tradeoff"] = {"metric": QUALITY_METRIC if tradeoff is None else "external",
                              "bits": list(bits), "ranks": ranks,
                              "frontiers": [[c.to_list() for c in f] for f in frontiers]}
    write_container(path, header, chunks)
    return PackReader(path).info


# ----------------------------------------------------------------------------------------------- read


class PackReader:
    """A pack on disk, memory-mapped and validated (magic, version, index, length)."""

    def __init__(self, path: str | Path):
        self.file = ContainerFile(path, FORMAT, SUPPORTED_VERSIONS)
        self.info = PackInfo(self.file.header, self.file.index)

    @property
    def header_bytes(self) -> bytes:
        """The raw header a server hands a client (``8 + N`` bytes)."""
        return self.file.header_bytes

    def ranges(self, shard: int, r: int, b_a: int, b_b: int) -> list[tuple[int, int]]:
        return self.info.ranges(shard, r, b_a, b_b)

    def config_bytes(self, shard: int, r: int, b_a: int, b_b: int) -> int:
        return self.info.config_bytes(shard, r, b_a, b_b)

    def read(self, shard: int, r: int, b_a: int, b_b: int) -> dict[tuple[int, int], bytes]:
        return self.file.read_ranges(self.ranges(shard, r, b_a, b_b))

    def decode(self, shard: int, r: int, b_a: int, b_b: int, **kw) -> KVShard:
        return decode_shard(self.info, shard, r, b_a, b_b, self.read(shard, r, b_a, b_b), **kw)

    def frontier(self, shard: int) -> list[Config]:
        return self.info.frontier(shard)

    def verify(self) -> None:
        self.file.verify()


# --------------------------------------------------------------------------------------------- decode


def decode_factors(info: PackInfo, shard: int, r: int, b_a: int, b_b: int,
                   blobs: Mapping[tuple[int, int], bytes], *, verify: bool = True
                   ) -> dict[UnitId, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Dequantised ``(A (n, r), B (r, d), mean (d,))`` float32 per unit, from the config's bytes only.

    For reconstructors that do the ``A @ B + mean`` themselves (OpenCL, on-device kernels).
    """
    geo, src = info.geometry, ByteSource(blobs)
    ids = info.chunks(shard, r, b_a, b_b)
    data = []
    for i in ids:
        buf = src.get(*info.index.span(i))
        if verify:
            info.index.check(i, buf)
        data.append(buf)
    units = info.units(shard)
    nu = len(units)
    means = np.frombuffer(data[0], dtype="<f2").reshape(nu, geo.d).astype(np.float32)
    if r == 0:
        return {u: (np.zeros((geo.n, 0), np.float32), np.zeros((0, geo.d), np.float32), means[k])
                for k, u in enumerate(units)}
    groups = -(-r // geo.group)
    pos = 1
    factors = []
    for length, bits in ((geo.n, b_a), (geo.d, b_b)):
        pb = plane_bytes(length)
        planes = []
        for p in range(bits):
            raw = np.frombuffer(b"".join(data[pos:pos + groups]), dtype=np.uint8)
            pos += groups
            if p == 0:
                recs = raw.reshape(r, nu, HEAD_BYTES + pb)
                scales = np.ascontiguousarray(recs[..., :4]).view("<f4")[..., 0]  # (r, U)
                zero = recs[..., 4]  # (r, U)
                planes.append(recs[..., HEAD_BYTES:])
            else:
                planes.append(raw.reshape(r, nu, pb))
        codes = from_planes(np.stack(planes), length)  # (r, U, L)
        factors.append([dequantize(codes[:, k], scales[:, k], bits, zero[:, k]) for k in range(nu)])  # (r, L)
    return {u: (np.ascontiguousarray(factors[0][k].T), factors[1][k], means[k]) for k, u in enumerate(units)}


def decode_shard(info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Mapping[tuple[int, int], bytes],
                 *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", verify: bool = True
                 ) -> KVShard:
    """Rebuild K, V (n, d) for every (step, layer) of a shard from the bytes of its ranges only.

    ``blobs`` maps ``(offset, length)`` → bytes as received; any blob covering a chunk will do, so
    ranges merged across shards work too. Each chunk is CRC-checked unless ``verify=False``.
    """
    out: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    for (step, layer, kind), (a, b, mean) in decode_factors(info, shard, r, b_a, b_b, blobs, verify=verify).items():
        a_t, b_t, m_t = (torch.from_numpy(t).to(device) for t in (a, b, mean))
        x = torch.addmm(m_t, a_t, b_t) if r else m_t.expand(info.geometry.n, -1).clone()
        out.setdefault((step, layer), {})[kind] = x.to(dtype)
    return {key: (kv["k"], kv["v"]) for key, kv in out.items()}
