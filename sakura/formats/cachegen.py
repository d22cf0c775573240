"""CacheGen baseline adapted to DiT template caches (Liu et al., SIGCOMM'24; LMCache's ``cachegen`` serde).

Kept from CacheGen's public design (the numeric part is :mod:`sakura.formats.cachegen_codec`):
per-token max-abs quantisation, layer-group bin counts (earlier layers get more bins; CacheGen's
7B split scaled to this depth: K first 10/32 of layers, next 10/32, rest; V first 2/32, rest),
entropy coding with a per-(layer, kind, channel) symbol distribution estimated from the cache, a
few independently stored quality levels, and token chunks (256 tokens) coded as independent streams.

Adapted to this problem, and why:
- **Levels span SAKURA's byte range**: six levels from the coarsest CacheGen's quantiser allows
  (4 bins = ternary codes) to K 128/64/64 V 128/64 (relative error ~1e-3, far below SAKURA's best
  configuration). LMCache ships one level (K 32/16/16 V 32/16, our L3). The floor is ternary: a
  token row needs its f2 scale (1/256 of FP16 for d = 256) plus ≳ 0.5 bit per value: 5–6× the
  smallest SAKURA configuration on our templates; fewer bins (``c = 0``) would code nothing.
- **The fetch unit is a shard** (the same shard plan as SAKURA), and each level of a unit is the whole
  shard at one stored level: one contiguous byte range, one request, one rebuild per shard, so both
  systems see the same request count, monitor and look-ahead. CacheGen picks a level per token chunk;
  here its policy picks one per shard from the same measured throughput.
- **Tables on first use**: each level's tables are one chunk of their own, fetched with the first
  shard that uses the level in an edit (:meth:`CacheGenEncoding.priced` charges them to that request),
  not all levels up front.
- **Dropped**: the paper's anchor/delta coding between neighbouring tokens (§5.1). LMCache's released
  serde does not use it, and on these caches it rarely paid (it was an option of format v1).
- **CPU decode**: constriction's ANS on the CPU, models built once per level per edit (see
  :mod:`sakura.formats.cachegen_codec` for what was measured); CacheGen's authors decode with CUDA kernels.

File chunk order: the tables of level 0..L−1 (:func:`cachegen_codec.pack_tables`), then for each
shard, for each level, for each token chunk: ``[f2 scales per unit][ANS words]``. Shard ``s`` at level
``lv`` is therefore one contiguous range, its token chunks separate (CRC-checked) chunks inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sakura.formats import cachegen_codec as codec
from sakura.formats.base import KV, FetchUnit, Level, Range, StreamEncoding, shard_label
from sakura.formats.container import Blobs, PackFormatError, StoredInfo, checked_plan, geometry_ints, write_container
from sakura.kvcache import KVCache, kv_pairs, shard_plan, shard_units

FORMAT = "sakura-cachegen"
VERSION = 2  # 2: shard → level → token chunk layout, per-level lzma tables, ANS
MAX_LEVELS = 16
SUFFIX = ".cachegen"
Bins = tuple[tuple[int, ...], tuple[int, ...]]  # (key bins per layer group, value bins per layer group)
# Lowest quality first. L3 is the configuration LMCache ships for 7B models (K 32/16/16, V 32/16).
DEFAULT_LEVELS: tuple[Bins, ...] = (
    ((4, 4, 4), (4, 4)),
    ((8, 4, 4), (8, 4)),
    ((16, 8, 8), (16, 8)),
    ((32, 16, 16), (32, 16)),
    ((64, 32, 32), (64, 32)),
    ((128, 64, 64), (128, 64)),
)


@dataclass(frozen=True)
class CacheGenGeometry:
    num_steps: int
    num_layers: int
    heads: int
    head_dim: int
    n: int
    shard_size: int
    chunk_tokens: int
    levels: tuple[Bins, ...]

    def __post_init__(self):
        if not self.levels or any(len(k) != 3 or len(v) != 2 for k, v in self.levels):
            raise ValueError("levels need 3 key and 2 value bin counts each")
        if any(not 4 <= b <= 256 for k, v in self.levels for b in k + v):
            raise ValueError("bin counts must be in 4..256 (fewer than 4 leaves no code)")
        if self.n <= 0 or self.chunk_tokens <= 0:
            raise ValueError("need tokens and a positive chunk size")

    @property
    def d(self) -> int:
        return self.heads * self.head_dim

    def token_chunks(self) -> list[tuple[int, int]]:
        return [(t, min(t + self.chunk_tokens, self.n)) for t in range(0, self.n, self.chunk_tokens)]

    def bins(self, level: int, layer: int, kind: str) -> int:
        """CacheGen's layer groups, scaled from its 32-layer config to this depth."""
        key_bins, value_bins = self.levels[level]
        frac = lambda k: max(1, round(self.num_layers * k / 32))  # noqa: E731
        if kind == "k":
            return key_bins[0] if layer < frac(10) else key_bins[1] if layer < frac(20) else key_bins[2]
        return value_bins[0] if layer < frac(2) else value_bins[1]

    def code_max(self, level: int, layer: int, kind: str) -> int:
        """``c``: codes are in [-c, c], 2c + 1 symbols."""
        return self.bins(level, layer, kind) // 2 - 1

    def groups(self) -> list[tuple[int, str]]:
        """(layer, kind) in table order."""
        return [(layer, kind) for layer in range(self.num_layers) for kind in "kv"]

    def table_shapes(self, level: int) -> list[tuple[int, int]]:
        return [(self.d, 2 * self.code_max(level, layer, kind) + 1) for layer, kind in self.groups()]


def write_cachegen(path: str | Path, cache: KVCache, *, shard_size: int = 1, chunk_tokens: int = 256,
                   levels=DEFAULT_LEVELS, model_id: str = "", template_id: str = "") -> "CacheGenInfo":
    geo = CacheGenGeometry(cache.num_steps, cache.num_layers, cache.heads, cache.head_dim, cache.num_reused,
                           shard_size, chunk_tokens, tuple((tuple(k), tuple(v)) for k, v in levels))
    plan = shard_plan(geo.num_steps, geo.num_layers, shard_size)
    tables, data = [], {}
    for lv in range(len(geo.levels)):
        freqs = _level_frequencies(cache, geo, lv)
        tables.append(codec.pack_tables([freqs[g] for g in geo.groups()]))
        level_models = {g: codec.models(f) for g, f in freqs.items()}
        for s, shard in enumerate(plan):
            data[s, lv] = _encode_shard(cache, geo, lv, shard_units(*shard), level_models)
    chunks = tables + [c for s in range(len(plan)) for lv in range(len(geo.levels)) for c in data[s, lv]]
    header = {"format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
              "geometry": {**{k: getattr(geo, k) for k in ("num_steps", "num_layers", "heads", "head_dim", "n",
                                                            "shard_size", "chunk_tokens")},
                           "levels": [[list(k), list(v)] for k, v in geo.levels]},
              "scheme": "per-token max-abs, layer-group bins, ANS with per-(layer,kind,channel) tables "
                        f"(u16 frequencies summing to ~{codec.TABLE_TOTAL}, lzma per level)",
              "shards": [list(s) for s in plan]}
    write_container(path, header, chunks)
    return CacheGenInfo.open(path)[1]


def _unit(cache: KVCache, step: int, layer: int, kind: str) -> np.ndarray:
    return cache.unit(step, layer, kind).float().numpy()


def _level_frequencies(cache: KVCache, geo: CacheGenGeometry, lv: int) -> dict[tuple[int, str], np.ndarray]:
    """Symbol frequencies of each (layer, kind, channel) at one level, over all steps and tokens."""
    out = {}
    for layer, kind in geo.groups():
        c = geo.code_max(lv, layer, kind)
        counts = sum(codec.channel_counts(codec.quantise(_unit(cache, s, layer, kind), c)[0], 2 * c + 1)
                     for s in range(geo.num_steps))
        out[layer, kind] = codec.frequencies(counts)
    return out


def _encode_shard(cache: KVCache, geo: CacheGenGeometry, lv: int, units, level_models) -> list[bytes]:
    """The token chunks of one shard at one level."""
    q = [codec.quantise(_unit(cache, *u), geo.code_max(lv, u[1], u[2])) for u in units]
    ms = [level_models[u[1], u[2]] for u in units]
    return [codec.encode_chunk([sym[t0:t1] for sym, _ in q], [sc[t0:t1] for _, sc in q], ms)
            for t0, t1 in geo.token_chunks()]


class CacheGenInfo(StoredInfo):
    """Parsed CacheGen header: geometry, and the ranges of each level's tables and of each (shard, level)."""

    magic, versions = FORMAT, (VERSION,)

    def __init__(self, header: dict[str, Any], index):
        super().__init__(header, index)
        # every field bounded and checked against the index before anything sized by it is built
        ints = geometry_ints(header, ("num_steps", "num_layers", "heads", "head_dim", "n", "shard_size",
                                      "chunk_tokens"), "CacheGen")
        levels = (header.get("geometry") or {}).get("levels")
        if not (isinstance(levels, list) and 1 <= len(levels) <= MAX_LEVELS and all(
                isinstance(lv, list) and len(lv) == 2 and all(isinstance(g, list) and len(g) <= 8 and all(
                    type(b) is int for b in g) for g in lv) for lv in levels)):
            raise PackFormatError(f"CacheGen header: levels must be 1..{MAX_LEVELS} [[key bins], [value bins]]")
        try:
            self.geometry = CacheGenGeometry(**ints, levels=tuple((tuple(k), tuple(v)) for k, v in levels))
        except ValueError as e:
            raise PackFormatError(f"CacheGen header is invalid: {e}") from None
        per_shard = len(levels) * -(-ints["n"] // ints["chunk_tokens"])
        self.shards = checked_plan(header, index, ints, per_shard, shard_plan, "CacheGen", extra_chunks=len(levels))

    @property
    def num_levels(self) -> int:
        return len(self.geometry.levels)

    @property
    def num_chunks(self) -> int:
        return len(self.geometry.token_chunks())

    def _check(self, shard: int | None, level: int) -> None:
        if not 0 <= level < self.num_levels or (shard is not None and not 0 <= shard < self.num_shards):
            raise PackFormatError(f"no CacheGen shard {shard} at level {level} "
                                  f"({self.num_shards} shards, {self.num_levels} levels)")

    def chunk_ids(self, shard: int, level: int) -> list[int]:
        """Container chunks of a shard at one level: its token chunks, in order."""
        self._check(shard, level)
        first = self.num_levels + (shard * self.num_levels + level) * self.num_chunks
        return list(range(first, first + self.num_chunks))

    def shard_range(self, shard: int, level: int) -> Range:
        ids = self.chunk_ids(shard, level)
        offset = self.index.span(ids[0])[0]
        return offset, self.index.span(ids[-1])[0] + self.index.span(ids[-1])[1] - offset

    def table_range(self, level: int) -> Range:
        self._check(None, level)
        return self.index.span(level)

    def storage_bytes(self, level: int | None = None) -> int:
        """Bytes on disk of one level (its tables + every shard at it), or of the whole file (all levels)."""
        if level is None:
            return self.index.file_size
        return self.table_range(level)[1] + sum(self.shard_range(s, level)[1] for s in range(self.num_shards))


class LevelModels:
    """A level's tables, parsed once; a (layer, kind)'s coder models are built the first time a shard
    needs them (256 models ≈ 0.6 ms), then reused for every later shard of the edit."""

    def __init__(self, geo: CacheGenGeometry, level: int, table: bytes):
        self.geo, self.level = geo, level
        self.freqs = dict(zip(geo.groups(), codec.unpack_tables(table, geo.table_shapes(level))))
        self._built: dict[tuple[int, str], tuple[int, list]] = {}

    def __getitem__(self, group: tuple[int, str]) -> tuple[int, list]:
        if group not in self._built:
            self._built[group] = (self.geo.code_max(self.level, *group), codec.models(self.freqs[group]))
        return self._built[group]


def decode_shard(info: CacheGenInfo, shard: int, models: LevelModels, blobs: Blobs, *, verify: bool = True) -> KV:
    """K, V (n, d) float32 of every (step, layer) of a shard at the level of ``models``, from received bytes."""
    import torch

    geo = info.geometry
    units = shard_units(*info.shards[shard])
    data = info.index.gather(info.chunk_ids(shard, models.level), blobs, verify=verify)
    groups = [models[layer, kind] for _, layer, kind in units]
    out = np.empty((len(units), geo.n, geo.d), np.float32)
    for (t0, t1), chunk in zip(geo.token_chunks(), data):
        codec.decode_chunk(chunk, groups, list(out[:, t0:t1]))
    return kv_pairs({u: torch.from_numpy(x) for u, x in zip(units, out)})


class CacheGenReader:
    """A stored file read locally (tools, tests): a shard at a level, tables included."""

    def __init__(self, path: str | Path):
        self.file, self.info = CacheGenInfo.open(path)
        self._models: dict[int, LevelModels] = {}

    def read(self, shard: int, level: int) -> dict[Range, bytes]:
        return self.file.read_ranges([self.info.table_range(level), self.info.shard_range(shard, level)])

    def models(self, level: int, blobs: Blobs | None = None) -> LevelModels:
        if level not in self._models:
            blobs = blobs or self.file.read_ranges([self.info.table_range(level)])
            [table] = self.info.index.gather([level], blobs)
            self._models[level] = LevelModels(self.info.geometry, level, table)
        return self._models[level]

    def decode(self, shard: int, level: int) -> KV:
        blobs = self.read(shard, level)
        return decode_shard(self.info, shard, self.models(level, blobs), blobs)


class CacheGenEncoding(StreamEncoding):
    """Fetch unit = one shard; level ``L<i>`` = the whole shard at stored level i (one range), preceded
    by that level's tables the first time the edit asks for it. Keeps per-edit state: make one per edit
    with ``fresh()``; ``ranges`` must be called once per request and ``decode`` in request order."""

    name = "cachegen"
    redecodable = False  # a level's tables come with its first use in the edit

    def __init__(self, info: CacheGenInfo):
        self.info = info
        self._units = [FetchUnit(s, s, shard_label(shard), self._levels(s)) for s, shard in enumerate(info.shards)]
        self._requested: set[int] = set()  # levels whose tables this edit has asked for
        self._models: dict[int, LevelModels] = {}  # levels whose tables this edit has decoded

    def _levels(self, shard: int) -> tuple[Level, ...]:
        n = self.info.num_levels
        # (work: an entropy decoder's time grows with the bytes it decodes)
        return tuple(Level(f"L{lv}", nbytes, float(n - lv), (lv,), work=float(nbytes))
                     for lv in range(n) for nbytes in [self.info.shard_range(shard, lv)[1]])

    @classmethod
    def from_header(cls, header: bytes) -> "CacheGenEncoding":
        return cls(CacheGenInfo.from_bytes(header))

    def fresh(self) -> "CacheGenEncoding":
        return CacheGenEncoding(self.info)

    @property
    def units(self):
        return self._units

    def priced(self, fetch_unit):
        """Each level's bytes as requested now: a level whose tables are not yet asked for carries them."""
        levels = tuple(lv if lv.key[0] in self._requested else
                       Level(lv.label, lv.nbytes + self.info.table_range(lv.key[0])[1], lv.error, lv.key, lv.work)
                       for lv in fetch_unit.levels)
        return replace(fetch_unit, levels=levels)

    def ranges(self, fetch_unit, level):
        (lv,) = level.key
        table = [] if lv in self._requested else [self.info.table_range(lv)]
        self._requested.add(lv)
        return table + [self.info.shard_range(fetch_unit.index, lv)]

    def decode(self, fetch_unit, level, blobs) -> KV:
        (lv,) = level.key
        ranges = ([] if lv in self._models else [self.info.table_range(lv)]) + [
            self.info.shard_range(fetch_unit.index, lv)]
        if len(blobs) != len(ranges):
            raise PackFormatError(f"CacheGen {fetch_unit.label} at L{lv}: expected {len(ranges)} received "
                                  f"ranges (tables first on a level's first use), got {len(blobs)}")
        received = dict(zip(ranges, blobs))
        if lv not in self._models:
            [table] = self.info.index.gather([lv], received)
            self._models[lv] = LevelModels(self.info.geometry, lv, table)
        return decode_shard(self.info, fetch_unit.index, self._models[lv], received)

    @property
    def storage_bytes(self):
        return self.info.storage_bytes()
