"""The progressive SAKURA pack: one file per template serving every level of every shard as byte ranges.

Version 1 (this module's layout; byte-level spec in docs/pack-format.md): per shard the mean, then A
planes 0..7 × component groups, then B's — configuration (r, b_A, b_B) is the mean plus the first
⌈r/G⌉ group chunks of the first b planes of each factor: ``b_A + b_B`` ranges in one multi-range
request. Version 2 (:mod:`sakura.formats.allocated`): per-group bit allocation and entropy-coded
planes, a level is one prefix range. :class:`PackInfo` parses both (the header's version picks), and
the decoders take a level's key as it comes (``r, b_A, b_B`` or ``k``).

This module only lays out, serialises and decodes: what a pack stores is computed offline
(:mod:`sakura.offline.compress`) and handed to :func:`write_pack` as a :class:`PackSource`.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

import numpy as np

from sakura.formats import anytime
from sakura.formats.base import KV, Level, Range, ShardEncoding
from sakura.formats.bitplanes import FactorBytes, QuantizedFactors, plane_records
from sakura.formats.container import (
    Blobs,
    PackFormatError,
    StoredInfo,
    check_lengths,
    checked_plan,
    coalesce,
    geometry_ints,
    write_container,
)
from sakura.formats.packgeometry import Config, Geometry
from sakura.kvcache import CacheUnit, kv_pairs, shard_plan, shard_units

if TYPE_CHECKING:
    import torch  # imported inside the functions that make tensors, not here: see sakura.kvcache

FORMAT = "sakura-pack"
VERSION = 1  # the uniform layout of this module; version 2 (per-group bits, coded planes): allocated.py;
# version 3 (version 2 plus the ladder of rungs up to the FP16 values): ladder.py
SUPPORTED_VERSIONS = (1, 2, 3)
SUFFIX = ""  # the pack is the template's main file: its file id is the template id
DEFAULT_GROUP = 8


@dataclass(frozen=True)
class Layout:
    """A pack layout version after this module's own: its header class, writer and decoders."""

    info_cls: type
    write: Callable
    decode_factors: Callable
    decode_shard: Callable  # -> (cache units, their K/V tensors)


# Later layouts register here (:mod:`sakura.formats.allocated`: version 2, imported with the package) so
# that this module, which they build on, never imports them.
LAYOUTS: dict[int, Layout] = {}


class PackInfo(StoredInfo):
    """Everything a client needs, parsed from the header bytes alone: geometry, ranges, frontiers."""

    magic, versions = FORMAT, SUPPORTED_VERSIONS

    def __new__(cls, header: dict[str, Any], index):
        if cls is PackInfo and header.get("version") in LAYOUTS:  # one magic, two layouts: the version picks
            cls = LAYOUTS[header["version"]].info_cls
        return super().__new__(cls)

    def __init__(self, header: dict[str, Any], index):
        super().__init__(header, index)
        self.geometry = _geometry(header)
        g = self.geometry
        self.shards = checked_plan(header, index, asdict(g), 1 + 2 * g.planes * g.num_groups, shard_plan, "pack")
        # The layout is regular: check the stored index against the formula once, then trust it.
        expected, self._base = [], []
        for step, l0, l1 in self.shards:
            self._base.append(len(expected))
            expected += g.chunk_lengths(2 * (l1 - l0))
        check_lengths(index, expected, "pack")

    @property
    def file_size(self) -> int:
        return self.index.file_size

    @property
    def model_id(self) -> str:
        return self.header.get("model_id", "")

    @property
    def template_id(self) -> str:
        return self.header.get("template_id", "")

    def units(self, shard: int) -> list[CacheUnit]:
        """The cache units of ``shard``, in storage order."""
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

    def ranges(self, shard: int, *key: int) -> list[Range]:
        """Absolute ``(offset, length)`` byte ranges of a level (v1 ``r, b_a, b_b``; v2 ``k``), merged where
        they touch."""
        return coalesce([self.index.span(i) for i in self.chunks(shard, *key)])

    def config_bytes(self, shard: int, *key: int) -> int:
        return sum(n for _, n in self.ranges(shard, *key))

    @property
    def version(self) -> int:
        return 1

    def level_for(self, shard: int, r: int, b_a: int, b_b: int) -> tuple:
        """The key of the level that stands for v1 configuration ``(r, b_A, b_B)``: itself here."""
        return r, b_a, b_b

    def is_rung(self, shard: int, key: tuple) -> bool:
        """Whether ``key`` is a ladder rung above the allocated levels (layout 3, :mod:`ladder`)."""
        return False

    def is_reference(self, shard: int, key: tuple) -> bool:
        """Whether ``key``'s bytes are another stored file's (the ladder's exact rung): not nested in
        any smaller level, its own anytime chain."""
        return False

    @property
    def references(self) -> list:
        """Other stored files this pack's levels read bytes of (:class:`~sakura.formats.base.FileRef`)."""
        return []

    def frontier(self, shard: int) -> list[Config]:
        table = self.header.get("tradeoff") or {}
        rows = (table.get("frontiers") or []) if isinstance(table, dict) else []
        if not isinstance(rows, list) or shard >= len(rows):
            return []
        try:
            return [Config.from_list(c) for c in rows[shard]]
        except (TypeError, ValueError):
            raise PackFormatError(f"pack frontier of shard {shard} is malformed") from None


def _geometry(header: dict[str, Any]) -> Geometry:
    """The geometry of a pack header, every field checked against sane limits and each other."""
    keys = [f.name for f in fields(Geometry)]
    geometry = header.get("geometry")
    if not isinstance(geometry, dict) or set(geometry) - set(keys):
        raise PackFormatError(f"pack header geometry must be an object with fields {keys}")
    if "shared_basis" not in geometry:  # packs written before the field: one basis per unit
        keys.remove("shared_basis")
    g = Geometry(**geometry_ints(header, keys, "pack"))
    if g.shared_basis and header.get("version") not in (2, 3):
        raise PackFormatError("a shared token basis needs pack version 2")
    if g.rank != g.max_stored_rank() or g.shard_size > g.num_layers:
        raise PackFormatError("pack header geometry is inconsistent (rank or shard size)")
    return g


# ---------------------------------------------------------------------------------------------- write

@dataclass
class PackSource:
    """What the offline side computed for one pack, for :func:`write_pack` to serialise.

    ``shards`` yields, in shard order, the quantised factors of the shard's cache units (storage
    order) and its frontier; it may be a generator, so a build never holds more than the encoded
    chunks. ``tradeoff`` is the header's table without its frontiers (``metric``, ``bits``,
    ``ranks``); None stores no frontiers. ``build`` gets the seconds spent producing and encoding.
    """

    geometry: Geometry
    shards: Iterable[tuple[Sequence[QuantizedFactors], Sequence[Config]]]
    reuse_index: torch.Tensor
    source_dtype: str
    build: dict[str, Any]
    tradeoff: dict[str, Any] | None
    version: int = VERSION  # 2: ``shards`` yields sakura.formats.allocated.AllocatedShard


def encode_shard(factors: Sequence[QuantizedFactors], geo: Geometry) -> list[bytes]:
    """One shard's chunks in file order from its cache units' quantised factors."""
    chunks = [np.stack([qf.mean for qf in factors]).astype("<f2").tobytes()]
    for records in (plane_records([qf.a_codes for qf in factors], [qf.a_scales for qf in factors],
                                  [qf.a_zero for qf in factors]),
                    plane_records([qf.b_codes for qf in factors], [qf.b_scales for qf in factors],
                                  [qf.b_zero for qf in factors])):
        for plane in records:
            for g in range(geo.num_groups):
                chunks.append(np.ascontiguousarray(plane[g * geo.group:(g + 1) * geo.group]).tobytes())
    return chunks


def write_pack(path: str | Path, source: PackSource, *, model_id: str = "", template_id: str = "") -> PackInfo:
    """Serialise one template's pack (v2 when ``source.version`` is 2); returns its parsed header."""
    if source.version in LAYOUTS:
        return LAYOUTS[source.version].write(path, source, model_id=model_id, template_id=template_id)
    geo = source.geometry
    t0 = time.perf_counter()
    chunks: list[bytes] = []
    frontiers: list[list[Config]] = []
    for factors, front in source.shards:
        chunks += encode_shard(factors, geo)
        frontiers.append(list(front))
    if len(frontiers) != len(geo.shards()):
        raise ValueError(f"pack source gave {len(frontiers)} shards, the geometry has {len(geo.shards())}")
    header = base_header(source, model_id, template_id, time.perf_counter() - t0)
    if source.tradeoff is not None:
        header["tradeoff"] = {**source.tradeoff, "frontiers": [[c.to_list() for c in f] for f in frontiers]}
    write_container(path, header, chunks)
    return PackReader(path).info


def base_header(source: PackSource, model_id: str, template_id: str, seconds: float) -> dict[str, Any]:
    """The header fields every pack version has (the version's own fields are added by its writer)."""
    import torch

    return {
        "format": FORMAT, "version": source.version, "model_id": model_id, "template_id": template_id,
        "geometry": asdict(source.geometry),
        "dtypes": {"source": source.source_dtype, "mean": "<f2", "scale": "<f4",
                   "zero": "u8 dead-zone bit per prefix length",
                   "code": "u8 offset-binary, bit planes MSB first", "reconstruct": "centre"},
        "build": {**source.build, "seconds": round(seconds, 3)},
        "reuse_index_crc32": zlib.crc32(source.reuse_index.to(torch.int64).numpy().astype("<i8").tobytes()),
        "shards": [list(s) for s in source.geometry.shards()],
    }


# ----------------------------------------------------------------------------------------------- read
class PackReader:
    """A pack on disk, memory-mapped and validated (magic, version, index, length)."""

    def __init__(self, path: str | Path):
        self.file, self.info = PackInfo.open(path)

    @property
    def header_bytes(self) -> bytes:
        """The raw header a server hands a client (``8 + N`` bytes)."""
        return self.file.header_bytes

    def ranges(self, shard: int, *key: int) -> list[Range]:
        return self.info.ranges(shard, *key)

    def config_bytes(self, shard: int, *key: int) -> int:
        return self.info.config_bytes(shard, *key)

    def read(self, shard: int, *key: int) -> dict[Range, bytes]:
        return self.file.read_ranges(self.ranges(shard, *key))

    def decode(self, shard: int, *key: int, **kw) -> KV:
        return decode_shard(self.info, shard, *key, self.read(shard, *key), **kw)

    def frontier(self, shard: int) -> list[Config]:
        return self.info.frontier(shard)

    def verify(self) -> None:
        self.file.verify()


# --------------------------------------------------------------------------------------------- decode
@dataclass
class ShardBytes:
    """The received bytes of one configuration of a shard, regrouped: means, then A's and B's planes."""

    units: list[CacheUnit]  # storage order (layer-major, K then V)
    n: int
    d: int
    r: int
    means: np.ndarray  # (U, d) float32
    a: FactorBytes | None  # None when r = 0 (means only)
    b: FactorBytes | None


def shard_bytes(info: PackInfo, shard: int, r: int, b_a: int, b_b: int, blobs: Blobs, *,
                verify: bool = True) -> ShardBytes:
    """Gather (and CRC-check) the chunks of a configuration into per-factor contiguous strings."""
    geo = info.geometry
    data = info.index.gather(info.chunks(shard, r, b_a, b_b), blobs, verify=verify)
    units = info.units(shard)
    means = np.frombuffer(data[0], dtype="<f2").reshape(len(units), geo.d).astype(np.float32)
    if r == 0:
        return ShardBytes(units, geo.n, geo.d, 0, means, None, None)
    groups = -(-r // geo.group)
    pos, factors = 1, []
    for length, bits in ((geo.n, b_a), (geo.d, b_b)):
        factors.append(FactorBytes(b"".join(data[pos:pos + bits * groups]), bits, length))
        pos += bits * groups
    return ShardBytes(units, geo.n, geo.d, r, means, factors[0], factors[1])


def decode_factors(info: PackInfo, shard: int, *key_blobs, verify: bool = True
                   ) -> dict[CacheUnit, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Dequantised ``(A (n, r), B (r, d), mean (d,))`` float32 per cache unit, from the level's bytes only:
    ``decode_factors(info, shard, *level_key, blobs)`` (v1 key ``r, b_a, b_b``; v2 key ``k``).

    For reconstructors that do the ``A @ B + mean`` themselves (OpenCL, on-device kernels).
    """
    *key, blobs = key_blobs
    if info.version in LAYOUTS:
        return LAYOUTS[info.version].decode_factors(info, shard, *key, blobs, verify=verify)
    r, b_a, b_b = key
    received = shard_bytes(info, shard, r, b_a, b_b, blobs, verify=verify)
    units, means = received.units, received.means
    if r == 0:
        return {u: (np.zeros((received.n, 0), np.float32), np.zeros((0, received.d), np.float32), means[k])
                for k, u in enumerate(units)}
    a = received.a.dequantize(r, len(units))  # (U, r, n)
    b = received.b.dequantize(r, len(units))  # (U, r, d)
    return {u: (np.ascontiguousarray(a[k].T), b[k], means[k]) for k, u in enumerate(units)}


def decode_shard(info: PackInfo, shard: int, *key_blobs, dtype: torch.dtype | None = None,
                 device: str | torch.device = "cpu", verify: bool = True) -> KV:
    """Rebuild K, V (n, d) for every (step, layer) of a shard from the bytes of its ranges only.

    Called ``decode_shard(info, shard, *level_key, blobs)``. ``blobs`` maps ``(offset, length)`` → bytes as
    received; any blob covering a chunk will do, so ranges merged across shards work too. Each chunk is
    CRC-checked unless ``verify=False``. ``dtype``: float32 when None.
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    if info.version in LAYOUTS:
        units, kv = LAYOUTS[info.version].decode_shard(info, shard, *key_blobs, verify=verify)
        return kv_pairs({u: x.to(device=device, dtype=dtype) for u, x in zip(units, kv)})
    rebuilt = {}
    for unit, (a, b, mean) in decode_factors(info, shard, *key_blobs, verify=verify).items():
        a_t, b_t, m_t = (torch.from_numpy(t).to(device) for t in (a, b, mean))
        x = torch.addmm(m_t, a_t, b_t) if a.shape[1] else m_t.expand(info.geometry.n, -1).clone()
        rebuilt[unit] = x.to(dtype)
    return kv_pairs(rebuilt)


class PackEncoding(ShardEncoding):
    """One progressive pack; fetch unit = shard; levels = its rank–precision frontier. The rebuild
    can be delegated to a reconstructor backend (torch / OpenCL: ``sakura.runtime.reconstruct``)."""

    name, info_cls = "sakura", PackInfo
    progressive = True  # every level's chunks are ordered so that chain points decode (``prefixes``)
    reconstructor = None  # anything with .rebuild(info, shard, *key, blobs) -> {(step, layer): (K, V)}

    def __init__(self, info, level_output_mse: bool = True):
        self.info = info
        self._weights = self.output_weights()  # (checked once: every unit reads it)
        # Each level priced by its own measured output MSE where the header has them (off: the pack's own errors,
        # what measuring them again needs)
        self._level_mse = self.level_output_mse() if level_output_mse else None
        self._reuse_mse = self.reuse_output_mse() if level_output_mse else None
        super().__init__(info)
        self._chains: dict = {}

    def _build(self) -> dict:
        """The header's build section (what the offline side measured), {} where there is none."""
        build = self.info.header.get("build")
        return build if isinstance(build, dict) else {}

    @property
    def prices_pending(self) -> bool:
        return self._build().get("output_weights_pending") is True  # (sakura.offline.output_weights.PENDING)

    def step_error(self, fetch_unit):
        errors = self._build().get("step_error")  # (packs built before session 9 lack it)
        if not errors or errors[fetch_unit.index] is None:
            return None
        weight = self._weight(fetch_unit.index)
        if self._reuse_mse is not None and self._reuse_mse[fetch_unit.index] is not None and weight > 0:
            return self._reuse_mse[fetch_unit.index] / weight  # (a reuse's measured output MSE, on the levels' scale)
        return errors[fetch_unit.index]

    def reuse_output_mse(self) -> list[float | None] | None:
        """Per shard: the output's masked MSE with that shard on the previous step's exact K/V (None: step 0;
        :mod:`sakura.offline.output_weights`; packs built before session 36 lack it)."""
        table = self._build().get("reuse_output_mse")
        if table is None:
            return None
        if (not isinstance(table, list) or len(table) != self.info.num_shards
                or not all(m is None or (isinstance(m, (int, float)) and math.isfinite(m) and m >= 0) for m in table)):
            raise PackFormatError(f"pack header: build.reuse_output_mse must be {self.info.num_shards} finite "
                                  "non-negative numbers or nulls (corrupt or foreign header)")
        return [None if m is None else float(m) for m in table]

    def output_weights(self) -> list[float] | None:
        """Per shard, the output's masked MSE per unit of error (packs built before session 27 lack it)."""
        weights = self._build().get("output_weight")
        if weights is None:
            return None
        if (not isinstance(weights, list) or len(weights) != self.info.num_shards
                or not all(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0 for w in weights)):
            raise PackFormatError(f"pack header: build.output_weight must be {self.info.num_shards} finite "
                                  "non-negative numbers (corrupt or foreign header)")
        return [float(w) for w in weights]

    def level_output_mse(self) -> list[list[float]] | None:
        """Per shard, per level (the frontier's order): the output's masked MSE with that shard at the level
        (:mod:`sakura.offline.output_weights`; packs built before session 34 lack it)."""
        table = self._build().get("level_output_mse")
        if table is None:
            return None
        sizes = [len(self.info.frontier(j)) for j in range(self.info.num_shards)]
        if (not isinstance(table, list) or [len(t) if isinstance(t, list) else -1 for t in table] != sizes
                or not all(isinstance(m, (int, float)) and math.isfinite(m) and m >= 0 for t in table for m in t)):
            raise PackFormatError("pack header: build.level_output_mse must hold a finite non-negative number per "
                                  "level of every shard (corrupt or foreign header)")
        return [[float(m) for m in t] for t in table]

    def local_output_mse(self) -> float | None:
        """Local generation's masked MSE against the exact-cache output, in the unit of weighted errors."""
        mse = self._build().get("local_output_mse")
        if mse is not None and not (isinstance(mse, (int, float)) and math.isfinite(mse) and mse >= 0):
            raise PackFormatError("pack header: build.local_output_mse must be a finite non-negative number")
        return None if mse is None else float(mse)

    def _weight(self, shard):
        return self._weights[shard] if self._weights else 1.0

    def _levels(self, shard):
        frontier = self.info.frontier(shard)
        if not frontier:
            raise PackFormatError(f"pack for {self.info.template_id} has no trade-off profile for shard {shard}")
        g, units = self.info.geometry, len(self.info.units(shard))
        errors = [c.error for c in frontier]
        weight = self._weight(shard)
        if self._level_mse is not None and weight > 0:  # weight · error = the level's measured output MSE
            errors = [m / weight for m in self._level_mse[shard]]
        return tuple(Level(c.rung and f"rung {c.rung}" or
                           f"r{c.r}/a{c.b_a}/b{c.b_b}" + (f"/k{c.key[0]}" if len(c.key) == 1 else ""),
                           c.bytes, e, c.key, work=c.rebuild_work(units, g.n, g.d), rung=c.rung)
                     for c, e in zip(frontier, errors))

    def ranges(self, fetch_unit, level):
        """The level's chunks ordered so that smaller frontier configurations come first (see
        :meth:`anytime_chain`): any prefix that ends on a chain point decodes to that point."""
        return [r for segment in self.anytime_chain(fetch_unit.index, level.key)[1] for r in segment]

    def prefixes(self, fetch_unit, level, ranges):
        levels = {lv.key: lv for lv in fetch_unit.levels}  # only configurations this stream offers
        return anytime.prefixes(levels, level, *self.anytime_chain(fetch_unit.index, level.key))

    def decode_prefix(self, fetch_unit, level, ranges, blobs):
        return self._decode(fetch_unit.index, level.key, dict(zip(ranges, blobs)))

    def anytime_chain(self, shard: int, key: tuple) -> tuple[list[tuple], list[list[Range]]]:
        """:func:`anytime.nested_chain`, cached per (shard, key): headers are immutable."""
        if (shard, key) not in self._chains:
            self._chains[(shard, key)] = anytime.nested_chain(self.info, shard, key)
        return self._chains[(shard, key)]

    def _decode(self, shard, key, blobs):
        if self.reconstructor is not None and not self.info.is_rung(shard, key):  # (rungs are not low-rank)
            return self.reconstructor.rebuild(self.info, shard, *key, blobs)
        return decode_shard(self.info, shard, *key, blobs)

    @property
    def storage_bytes(self):
        return self.info.file_size

    @property
    def references(self):
        return self.info.references


class PackV1Encoding(PackEncoding):
    """The ``sakura-v1`` file (a version-1 pack kept beside the v2 one for before/after comparisons)."""

    name = "sakura-v1"
