"""Version 2 of the SAKURA pack: per-group bit allocation, entropy-coded planes, one range per level.

Version 1 stores every rank component at the same 8 planes and a level is ``(r, b_A, b_B)``: ``b_A + b_B``
byte ranges. Version 2 stores, per shard, the mean and then *chunks* — one ``(factor, component
group, bit plane)`` each, for all the shard's cache units — in the order an offline greedy allocation
added them (most error removed per byte first, :mod:`sakura.offline.allocate`). A level is the first
``k`` chunks: **one contiguous range** from the shard's mean, and every smaller level is a prefix of
every larger one (anytime shards need exactly that). Planes of one ``(factor, group)`` appear in
order (MSB first) and a group only counts once both its A and B plane 0 are in the prefix, so a
prefix decodes to per-group plane counts ``(b_A[g], b_B[g])`` — KVTC-style bits where they matter.
Chunks the allocation never reached (planes below the pack's top quality) are not stored.

The mean rides as 8-bit codes over each unit's range (layout kind ``0x41``; float16 ``0x40`` is still
read). With ``geometry.shared_basis`` a shard may store one A for all its units (header
``shared_shards``): its K/V units are factorised together and each rebuilds as ``A·B_u + μ_u``.

A chunk's raw bytes are v1's records of that plane and group, with planes ``p ≥ 1`` in magnitude
form (:mod:`sakura.formats.chunkcodec`); each is stored raw or as a zstd frame, whichever is smaller
(a flag per chunk). Header additions: ``layout`` (base64, two bytes per chunk in file order: a kind
byte ``0x80`` coded, ``0x40`` mean, ``0x10`` factor B, low nibble the plane; then the group) and
``shard_chunks`` (chunks per shard); ``tradeoff.frontiers[s]`` rows are ``[k, bytes, error]``.
Decoding unpacks every plane 8 values per table lookup and dequantises in place with each component's
step and scale (:func:`dequantize_groups`), then one batched matmul (:func:`decode_shard`).
See docs/pack-format.md §8.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from sakura.formats import chunkcodec
from sakura.formats.bitplanes import HEAD_BYTES, QuantizedFactors, plane_bytes, plane_records
from sakura.formats.container import Blobs, PackFormatError, StoredInfo, coalesce, write_container
from sakura.formats.pack import LAYOUTS, Config, Geometry, Layout, PackInfo, PackReader, _geometry, base_header
from sakura.kvcache import shard_plan

if TYPE_CHECKING:
    import torch  # imported inside the functions that make tensors, not here: see sakura.kvcache

VERSION = 2
CODED, MEAN, FACTOR_B = 0x80, 0x40, 0x10
# Low nibble of a mean chunk's kind: how the shard's means are stored. The means ride with every
# level, and at the smallest ones float16 means were a fifth of the bytes; 8-bit codes over each
# unit's own range cost ~1e-4 of the smallest top-of-frontier error (docs/pack-format.md §8).
MEAN_F16, MEAN_U8 = 0x00, 0x01
MEAN_HEAD = 8  # per unit, before its u8 codes: float32 offset, float32 step


@dataclass(frozen=True)
class ChunkRef:
    """One stored chunk of a shard: plane ``plane`` of component group ``group`` of factor A (0) or B (1)."""

    factor: int
    group: int
    plane: int


@dataclass(frozen=True)
class PrefixConfig(Config):
    """A v2 level: the shard's first ``k`` chunks. ``r`` is the rank it decodes to and ``b_a`` / ``b_b``
    the mean planes per decoded component (for labels and reports); ``key = (k,)``."""

    k: int = 0

    @property
    def key(self) -> tuple[int]:
        return (self.k,)

    def to_list(self) -> list:
        return [self.k, self.bytes, self.error]


@dataclass
class AllocatedShard:
    """What the offline allocation hands the v2 writer for one shard: its factors, the stored mean chunk
    (:func:`encode_means`), whether its units share one A, the stored chunks (raw-or-coded bytes, coded
    flag) in file order, and the error of each frontier prefix ``k``."""

    factors: Sequence[QuantizedFactors]
    mean: bytes
    shared: bool  # the units share one token basis (one A)
    chunks: list[tuple[ChunkRef, bytes, bool]]
    frontier: list[tuple[int, float]]  # (k, error), k increasing, error decreasing
    extra: dict[str, Any] = field(default_factory=dict)


def raw_length(geo: Geometry, units: int, ref: ChunkRef, shared: bool = False) -> int:
    """Bytes of a raw chunk of a shard of ``units`` units (``shared``: its units share one A)."""
    length, copies = (geo.n, 1 if shared else units) if ref.factor == 0 else (geo.d, units)
    return geo.group_size(ref.group) * copies * (plane_bytes(length) + (HEAD_BYTES if ref.plane == 0 else 0))


def mean_length(kind: int, units: int, d: int) -> int:
    return units * (d * 2 if kind == MEAN_F16 else MEAN_HEAD + d)


def encode_means(means: np.ndarray) -> bytes:
    """``(U, d)`` means → a ``MEAN_U8`` chunk: per unit ``lo`` and ``step`` (f32), then ``d`` codes
    ``round((μ − lo) / step)``; ``μ̂ = lo + code · step`` (``step`` = range / 255, 0 for a flat mean)."""
    m = np.asarray(means, np.float64)
    lo = m.min(axis=1, keepdims=True).astype(np.float32)
    step = ((m.max(axis=1, keepdims=True) - lo) / 255).astype(np.float32)
    codes = np.where(step > 0, np.rint((m - lo) / np.where(step > 0, step, 1)), 0).clip(0, 255).astype(np.uint8)
    head = np.concatenate([lo, step], axis=1).astype("<f4").view(np.uint8)
    return np.concatenate([head, codes], axis=1).tobytes()


def decode_means(raw: bytes, kind: int, units: int, d: int) -> np.ndarray:
    """A mean chunk's bytes → ``(U, d)`` float32 (what every level of the shard rebuilds with)."""
    if kind == MEAN_F16:
        return np.frombuffer(raw, dtype="<f2").reshape(units, d).astype(np.float32)
    rec = np.frombuffer(raw, np.uint8).reshape(units, MEAN_HEAD + d)
    lo, step = (np.ascontiguousarray(rec[:, :MEAN_HEAD]).view("<f4")[:, i:i + 1] for i in (0, 1))
    return lo + rec[:, MEAN_HEAD:].astype(np.float32) * step


def encode_chunks(factors: Sequence[QuantizedFactors], geo: Geometry, shared: bool = False
                  ) -> dict[ChunkRef, tuple[bytes, bool]]:
    """Every ``(factor, group, plane)`` chunk of one shard, stored form (magnitude planes, raw or coded).
    ``shared``: the units' A is one array (a shared token basis), stored once."""
    out = {}
    a_owners = factors[:1] if shared else factors
    for f, (codes, scales, zero) in enumerate((([q.a_codes for q in a_owners], [q.a_scales for q in a_owners],
                                                 [q.a_zero for q in a_owners]),
                                                ([q.b_codes for q in factors], [q.b_scales for q in factors],
                                                 [q.b_zero for q in factors]))):
        records = plane_records(codes, scales, zero)
        sign = records[0][..., HEAD_BYTES:]
        for p, plane in enumerate(records):
            plane = plane if p == 0 else chunkcodec.to_magnitude(plane, sign)
            for g in range(geo.num_groups):
                raw = np.ascontiguousarray(plane[g * geo.group:(g + 1) * geo.group]).tobytes()
                out[ChunkRef(f, g, p)] = chunkcodec.encode(raw)
    return out


def layout_bytes(refs: Sequence[ChunkRef | None], coded: Sequence[bool]) -> bytes:
    """Two bytes per chunk (None = the shard's mean, 8-bit codes): kind, group."""
    out = bytearray()
    for ref, c in zip(refs, coded):
        kind = (CODED if c else 0) | (MEAN | MEAN_U8 if ref is None else (FACTOR_B if ref.factor else 0) | ref.plane)
        out += bytes([kind, 0 if ref is None else ref.group])
    return bytes(out)


class AllocatedPackInfo(PackInfo):
    """A version-2 pack header: per shard the chunk order, coded flags, prefix frontier."""

    def __init__(self, header: dict[str, Any], index):  # noqa: D107 - parsed and checked field by field
        StoredInfo.__init__(self, header, index)
        self.geometry = g = _geometry(header)
        plan = shard_plan(g.num_steps, g.num_layers, g.shard_size)
        counts = header.get("shard_chunks")
        if (
            not isinstance(counts, list)
            or len(counts) != len(plan)
            or not all(type(c) is int and c >= 1 for c in counts)
            or sum(counts) != len(index)
        ):
            raise PackFormatError("pack v2 shard_chunks do not match the geometry and the chunk index")
        if header.get("shards") != [list(s) for s in plan]:
            raise PackFormatError("pack shard list does not match the geometry")
        self.shards = plan
        try:
            layout = np.frombuffer(
                base64.b64decode(str(header.get("layout", "")).encode("ascii"), validate=True), np.uint8
            )
        except Exception:  # noqa: BLE001 - binascii.Error, UnicodeError
            raise PackFormatError("pack v2 layout is not base64") from None
        if len(layout) != 2 * len(index):
            raise PackFormatError(f"pack v2 layout describes {len(layout) // 2} chunks, the index has {len(index)}")
        shared = header.get("shared_shards", [0] * len(plan))
        if (not isinstance(shared, list) or len(shared) != len(plan)
                or any(type(v) is not int or v not in (0, 1) for v in shared) or (any(shared) and not g.shared_basis)):
            raise PackFormatError("pack v2 shared_shards must be one 0/1 per shard "
                                  "(1 only with geometry.shared_basis)")
        self._shared = [bool(v) for v in shared]
        self._coded = (layout[0::2] & CODED).astype(bool)
        self._base, self._refs, self._raw = [], [], np.zeros(len(index), np.int64)
        self._mean_kind: list[int] = []
        self._frontiers: dict[int, list[Config]] = {}
        pos = 0
        for s, (count, (_, l0, l1)) in enumerate(zip(counts, plan)):
            self._base.append(pos)
            chunks = layout[2 * pos:2 * (pos + count)]
            self._refs.append(self._shard_refs(chunks, 2 * (l1 - l0), pos, self._shared[s]))
            pos += count

    def _shard_refs(self, layout: np.ndarray, units: int, first: int, shared: bool) -> list[ChunkRef]:
        """The chunk refs of one shard after its mean, each checked: planes in order, lengths as implied."""
        g = self.geometry
        kinds, groups = layout[0::2], layout[1::2]
        if not kinds[0] & MEAN or kinds[0] & CODED or kinds[0] & 0x0F not in (MEAN_F16, MEAN_U8):
            raise PackFormatError(f"pack v2 shard at chunk {first} does not start with its raw mean")
        self._mean_kind.append(int(kinds[0] & 0x0F))
        self._raw[first] = mean_length(self._mean_kind[-1], units, g.d)
        refs, have = [], {}
        for i, (kind, group) in enumerate(zip(kinds[1:], groups[1:]), start=first + 1):
            ref = ChunkRef(int(bool(kind & FACTOR_B)), int(group), int(kind & 0x0F))
            if kind & MEAN or ref.group >= g.num_groups or ref.plane != have.get((ref.factor, ref.group), 0):
                raise PackFormatError(f"pack v2 chunk {i} is out of order or out of range")
            have[(ref.factor, ref.group)] = ref.plane + 1
            self._raw[i] = raw_length(g, units, ref, shared)
            refs.append(ref)
        for i in range(first, first + len(kinds)):
            stored = int(self.index.lengths[i])
            if stored != self._raw[i] if not self._coded[i] else not 0 < stored < self._raw[i]:
                raise PackFormatError(f"pack chunk index does not match the geometry at chunk {i}")
        return refs

    @property
    def version(self) -> int:
        return VERSION

    def validate(self, shard: int, k: int, *rest) -> None:  # type: ignore[override]
        if not 0 <= shard < self.num_shards:
            raise PackFormatError(f"shard {shard} out of range (pack has {self.num_shards})")
        if rest or type(k) is not int or not 0 <= k <= len(self._refs[shard]):
            raise PackFormatError(
                f"level {(k, *rest)} invalid: a v2 pack level is a chunk count 0..{len(self._refs[shard])}"
            )

    def chunks(self, shard: int, k: int, *rest) -> list[int]:  # type: ignore[override]
        """Chunk ids of the level ``k`` (the mean and the first ``k`` chunks): contiguous."""
        self.validate(shard, k, *rest)
        return list(range(self._base[shard], self._base[shard] + 1 + k))

    def refs(self, shard: int, k: int) -> list[ChunkRef]:
        self.validate(shard, k)
        return self._refs[shard][:k]

    def allocation(self, shard: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Planes per component group of A and B at level ``k``; groups missing either factor count 0."""
        bits = np.zeros((2, self.geometry.num_groups), np.int64)
        for ref in self.refs(shard, k):
            bits[ref.factor, ref.group] += 1
        bits[:, (bits == 0).any(axis=0)] = 0
        return bits[0], bits[1]

    def level_for(self, shard: int, r: int, b_a: int, b_b: int) -> tuple:
        """The largest level within the bytes v1's ``(r, b_A, b_B)`` takes (the allocator's rule at that
        budget); the top level for the full rank. For before/after comparisons (bench-device)."""
        front = self.frontier(shard)
        budget = self.geometry.config_bytes(len(self.units(shard)), r, b_a, b_b) if r < self.geometry.rank else np.inf
        return max((c for c in front if c.bytes <= budget), key=lambda c: c.bytes, default=front[0]).key

    def a_units(self, shard: int) -> int:
        """How many A factors ``shard`` stores: 1 when its units share a token basis, else one per unit."""
        return 1 if self._shared[shard] else len(self.units(shard))

    def mean_kind(self, shard: int) -> int:
        """How ``shard``'s mean chunk is stored: ``MEAN_U8`` (what the writer makes) or ``MEAN_F16``."""
        return self._mean_kind[shard]

    def stored_chunk(self, chunk: int) -> tuple[bool, int]:
        """``(coded?, raw length)`` of a chunk id."""
        return bool(self._coded[chunk]), int(self._raw[chunk])

    def frontier(self, shard: int) -> list[Config]:
        """The stored levels of ``shard`` (parsed once: headers are immutable). Each row's ``k`` must
        grow and its ``bytes`` be the level's range, so an allocator's budget is what it fetches."""
        if shard not in self._frontiers:
            self._frontiers[shard] = self._parse_frontier(shard)
        return self._frontiers[shard]

    def _frontier_rows(self, shard: int) -> list | None:
        """The header's frontier rows of ``shard`` (None: the pack stores none for it)."""
        table = self.header.get("tradeoff") or {}
        rows = (table.get("frontiers") or []) if isinstance(table, dict) else []
        if not isinstance(rows, list) or shard >= len(rows):
            return None
        return rows[shard]

    def _parse_frontier(self, shard: int) -> list[Config]:
        rows = self._frontier_rows(shard)
        if rows is None:
            return []
        g = self.geometry
        sizes = np.array([g.group_size(i) for i in range(g.num_groups)])
        bits, done, out = np.zeros((2, g.num_groups), np.int64), 0, []
        try:
            for k, nbytes, err in rows:
                if (
                    type(k) is not int
                    or not done <= k <= len(self._refs[shard])
                    or nbytes != self.config_bytes(shard, k)
                ):
                    raise ValueError
                for ref in self._refs[shard][done:k]:  # one pass over the chunks for all rows
                    bits[ref.factor, ref.group] += 1
                done = k
                opened = (bits > 0).all(axis=0)
                r = int(sizes[opened].sum())
                mean = [round(float((f * sizes)[opened].sum() / r), 1) if r else 0.0 for f in bits]
                out.append(PrefixConfig(r, mean[0], mean[1], int(nbytes), float(err), k))
        except (TypeError, ValueError, PackFormatError):
            raise PackFormatError(f"pack frontier of shard {shard} is malformed") from None
        return out


def received_planes(info: AllocatedPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
    """``(units, means (U, d) float32, planes, groups)`` of level ``k``: each chunk CRC-checked and
    decoded to raw bytes; ``planes[f][g]`` lists a factor's group's planes, MSB first; ``groups`` are
    the groups holding both factors (the decoded components, in group order)."""
    ids = info.chunks(shard, k)
    data = info.index.gather(ids, blobs, verify=verify)
    units = info.units(shard)
    means = decode_means(data[0], info.mean_kind(shard), len(units), info.geometry.d)
    planes: list[dict[int, list[bytes]]] = [{}, {}]
    for cid, ref, stored in zip(ids[1:], info.refs(shard, k), data[1:]):
        coded, raw = info.stored_chunk(cid)
        planes[ref.factor].setdefault(ref.group, []).append(chunkcodec.decode(stored, coded, raw, f"chunk {cid}"))
    return units, means, planes, sorted(set(planes[0]) & set(planes[1]))


def decode_factors(info: AllocatedPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
    """``{unit: (A (n, r), B (r, d), mean (d,))}`` float32 for level ``k`` of ``shard`` (as v1's decode_factors)."""
    from sakura.formats.groupdequant import dequantize_groups  # torch: not for header-only readers (the server)

    geo = info.geometry
    units, means, planes, groups = received_planes(info, shard, k, blobs, verify=verify)
    a = dequantize_groups(planes[0], groups, geo, geo.n, info.a_units(shard))
    b = dequantize_groups(planes[1], groups, geo, geo.d, len(units))
    return {u: (a[i if len(a) > 1 else 0].T, b[i], means[i]) for i, u in enumerate(units)}


def low_rank(means: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A·B + μ`` for every unit: ``means (U, d)``, ``a (U or 1, n, r)`` (1: a shared token basis),
    ``b (U, r, d)`` → ``(U, n, d)``, one batched matmul."""
    import torch

    return torch.baddbmm(means[:, None, :], a.expand(len(b), -1, -1), b)


def decode_shard(info: AllocatedPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
    """``(units, K/V (U, n, d) float32 tensor)`` of level ``k``: the factors dequantised in one pass per
    factor and ``A·B + μ`` as one batched matmul (A used transposed in place)."""
    import torch  # (torch, here and in groupdequant: not for header-only readers such as the server)

    from sakura.formats.groupdequant import dequantize_groups  # torch: not for header-only readers (the server)

    geo = info.geometry
    units, means, planes, groups = received_planes(info, shard, k, blobs, verify=verify)
    m = torch.from_numpy(means)
    if not groups:
        return units, m[:, None, :].expand(len(units), geo.n, geo.d).clone()
    a = torch.from_numpy(dequantize_groups(planes[0], groups, geo, geo.n, info.a_units(shard)))
    b = torch.from_numpy(dequantize_groups(planes[1], groups, geo, geo.d, len(units)))
    return units, low_rank(m, a.transpose(1, 2), b)


def level_ranges(info: AllocatedPackInfo, shard: int, k: int) -> list[tuple[int, int]]:
    return coalesce([info.index.span(i) for i in info.chunks(shard, k)])


def write_allocated(path, source, *, model_id: str = "", template_id: str = "") -> AllocatedPackInfo:
    """Serialise a v2 pack from a :class:`~sakura.formats.pack.PackSource` whose ``shards`` yield
    :class:`AllocatedShard` (``source.version == 2``); returns its parsed header."""
    geo = source.geometry
    t0 = time.perf_counter()
    chunks: list[bytes] = []
    refs: list[ChunkRef | None] = []
    coded: list[bool] = []
    counts: list[int] = []
    shared: list[int] = []
    frontiers: list[list[list]] = []
    for shard in source.shards:
        shared.append(int(shard.shared))
        chunks.append(shard.mean)
        refs.append(None)
        coded.append(False)
        sizes = [len(chunks[-1])]
        for ref, stored, is_coded in shard.chunks:
            chunks.append(stored)
            refs.append(ref)
            coded.append(is_coded)
            sizes.append(len(stored))
        counts.append(1 + len(shard.chunks))
        ends = np.cumsum(sizes)
        frontiers.append([[k, int(ends[k]), err] for k, err in shard.frontier])
    if len(counts) != len(geo.shards()):
        raise ValueError(f"pack source gave {len(counts)} shards, the geometry has {len(geo.shards())}")
    header = base_header(source, model_id, template_id, time.perf_counter() - t0)
    header["dtypes"].update(mean="u8 per unit: <f4 lo, <f4 step, d codes (layout kind 0x41)",
                            code="u8 offset-binary; planes >= 1 stored XOR NOT plane 0 (magnitude)",
                            coding="raw, or one zstd frame per chunk (layout flag 0x80)")
    header.update(shard_chunks=counts, layout=base64.b64encode(layout_bytes(refs, coded)).decode("ascii"))
    if geo.shared_basis:
        header["shared_shards"] = shared
    if source.tradeoff is not None:
        header["tradeoff"] = {**source.tradeoff, "frontiers": frontiers}
    write_container(path, header, chunks)
    return PackReader(path).info


LAYOUTS[VERSION] = Layout(AllocatedPackInfo, write_allocated, decode_factors, decode_shard)
