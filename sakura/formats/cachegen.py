"""CacheGen baseline adapted to DiT template caches (Liu et al., SIGCOMM'24; LMCache's ``cachegen`` serde).

What is kept from CacheGen's public design:
- **per-token quantisation**: each token row of a unit gets a max-abs scale and symmetric codes in
  ``[-C, C]``, ``C = bins // 2 − 1`` (as LMCache's ``torch_quant``);
- **layer-group bin counts**: earlier layers are more sensitive, so they get more bins; the split
  follows CacheGen's 7B config scaled to the model's depth (K: first 10/32 of layers, next 10/32,
  rest; V: first 2/32, rest);
- **arithmetic coding with a per-(layer, channel) symbol distribution** (``constriction``'s range
  coder), the distribution estimated from the cache itself and stored once per level;
- **a few independently stored quality levels** (3: bins ×½, ×1 = LMCache's default, ×2);
- **token-chunk granularity**: the fetch unit is one token chunk at one level.
- optional **anchor/delta coding** (CacheGen paper §5.1): within groups of ``anchor_group``
  consecutive tokens the first is stored at 8 bits and the others as deltas to its reconstruction.
  Off by default, like LMCache's released serde; measured on DiT-like caches it rarely pays.

Adaptation to DiT: an LLM prefix is loaded before decoding, but a DiT edit consumes the cache shard
by shard, so a chunk here covers the tokens ``[t0, t1)`` of all cache units of *one shard*; the client
picks a level per chunk from measured throughput, shard after shard, like SAKURA's allocator.

File chunk order: entropy models of level 0..L−1 (u16 frequencies, shape (layers, 2, d, symbols)),
then for each shard, for each token chunk, for each level: the encoded chunk:
``[token scales U×T' f2][anchor scales U×A f2][anchor codes U×A×d i8][range-coder words u32]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import constriction
import numpy as np
import torch

from sakura.formats.base import KV, FetchUnit, Level, Range, StreamEncoding, shard_label
from sakura.formats.container import Blobs, PackFormatError, StoredInfo, write_container
from sakura.kvcache import CacheUnit, KVCache, kv_pairs, shard_plan, shard_units

FORMAT = "sakura-cachegen"
VERSION = 1
SUFFIX = ".cachegen"
# (key bins per layer group, value bins per layer group), lowest quality first. Level 1 is the
# configuration LMCache ships for 7B models (K 32/16/16, V 32/16).
DEFAULT_LEVELS: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = (
    ((16, 8, 8), (16, 8)),
    ((32, 16, 16), (32, 16)),
    ((64, 32, 32), (64, 32)),
)
ANCHOR_C = 127  # anchors: 8-bit symmetric


@dataclass(frozen=True)
class CacheGenGeometry:
    num_steps: int
    num_layers: int
    heads: int
    head_dim: int
    n: int
    shard_size: int
    chunk_tokens: int
    anchor_group: int  # 0 = no delta coding
    levels: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]

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

    def symbols(self, level: int) -> int:
        """Alphabet size of a level's model table (the largest of its layer groups)."""
        return max(2 * (b // 2 - 1) + 1 for group in self.levels[level] for b in group)

    def anchors(self, t0: int, t1: int) -> np.ndarray:
        """Boolean mask over the chunk's tokens: True for anchor tokens."""
        idx = np.arange(t1 - t0)
        return idx % self.anchor_group == 0 if self.anchor_group > 0 else np.zeros(t1 - t0, bool)


def _quant_rows(x: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row max-abs symmetric quantisation to [-c, c]; scales rounded to f2 first so decode agrees."""
    m = np.abs(x).max(axis=1).astype(np.float16).astype(np.float64)
    m = np.where(m > 0, m, 1.0)  # all-zero rows stay zero whatever the scale
    q = np.clip(np.round(x * (c / m[:, None])), -c, c)
    return q.astype(np.int32), m.astype(np.float16)


def _encode_rows(x: np.ndarray, anchors: np.ndarray, c: int):
    """(symbols of delta rows (T', d) in [0, 2c], their scales, anchor codes (A, d) i8, anchor scales)."""
    a_codes, a_scales = _quant_rows(x[anchors], ANCHOR_C)
    x_rest = x[~anchors]
    if anchors.any():  # deltas to the reconstructed anchor, so the decoder can undo them exactly
        a_hat = a_codes * (a_scales.astype(np.float64)[:, None] / ANCHOR_C)
        x_rest = x_rest - a_hat[np.cumsum(anchors)[~anchors] - 1]
    q, scales = _quant_rows(x_rest, c)
    return (q + c), scales, a_codes.astype(np.int8), a_scales


def _model(freq: np.ndarray) -> Any:
    return constriction.stream.model.Categorical(freq.astype(np.float64), perfect=False)


def _models(table: np.ndarray) -> list[list[list[Any]]]:
    """Coder models for a level's (layers, 2, d, symbols) frequency table, indexed [layer][kind][channel]."""
    return [[[_model(f) for f in per_kind] for per_kind in per_layer] for per_layer in table]


def _frequencies(counts: np.ndarray) -> np.ndarray:
    """Counts → u16 frequencies (every seen symbol keeps ≥ 1; unseen ones get the coder's floor)."""
    total = counts.sum(axis=-1, keepdims=True).clip(min=1)
    f = np.round(counts * (65535.0 / total))
    return np.where(counts > 0, np.maximum(f, 1), 0).astype(np.uint16)


def write_cachegen(path: str | Path, cache: KVCache, *, shard_size: int = 1, chunk_tokens: int = 256,
                   anchor_group: int = 0, levels=DEFAULT_LEVELS, model_id: str = "",
                   template_id: str = "") -> "CacheGenInfo":
    geo = CacheGenGeometry(cache.num_steps, cache.num_layers, cache.heads, cache.head_dim, cache.num_reused,
                           shard_size, chunk_tokens, anchor_group, tuple((tuple(k), tuple(v)) for k, v in levels))
    plan = shard_plan(geo.num_steps, geo.num_layers, shard_size)
    chunks_t = geo.token_chunks()

    def unit(s: int, layer: int, kind: str) -> np.ndarray:  # via float32: torch's fp16→fp64 cast is slow
        return cache.unit(s, layer, kind).float().numpy().astype(np.float64)

    def encoded(level: int, x: np.ndarray, layer: int, kind: str, t0: int, t1: int):
        return _encode_rows(x[t0:t1], geo.anchors(t0, t1), geo.bins(level, layer, kind) // 2 - 1)

    # Pass 1: symbol statistics per (level, layer, kind, channel) over all steps and tokens.
    counts = [np.zeros((geo.num_layers, 2, geo.d, geo.symbols(lv)), np.int64) for lv in range(len(levels))]
    for s in range(geo.num_steps):
        for layer in range(geo.num_layers):
            for kind in "kv":
                x = unit(s, layer, kind)
                for lv, cnt in enumerate(counts):
                    k = cnt.shape[-1]
                    for t0, t1 in chunks_t:
                        flat = (np.arange(geo.d)[None, :] * k + encoded(lv, x, layer, kind, t0, t1)[0]).ravel()
                        cnt[layer, "kv".index(kind)] += np.bincount(flat, minlength=geo.d * k).reshape(geo.d, k)
    freqs = [_frequencies(c) for c in counts]
    chunks: list[bytes] = [f.astype("<u2").tobytes() for f in freqs]
    models = [_models(f) for f in freqs]

    # Pass 2: encode every (shard, token chunk, level).
    for shard in plan:
        units = shard_units(*shard)
        xs = [unit(*u) for u in units]
        for t0, t1 in chunks_t:
            for lv in range(len(levels)):
                parts = [encoded(lv, x, layer, kind, t0, t1) for x, (_, layer, kind) in zip(xs, units)]
                enc = constriction.stream.queue.RangeEncoder()
                for (sym, *_), (_, layer, kind) in zip(parts, units):
                    for ch, model in enumerate(models[lv][layer]["kv".index(kind)]):
                        if len(sym):
                            enc.encode(np.ascontiguousarray(sym[:, ch], dtype=np.int32), model)
                chunks.append(b"".join(p[1].astype("<f2").tobytes() for p in parts)
                              + b"".join(p[3].astype("<f2").tobytes() for p in parts)
                              + b"".join(p[2].tobytes() for p in parts)
                              + enc.get_compressed().astype("<u4").tobytes())
    header = {"format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
              "geometry": {**{k: getattr(geo, k) for k in ("num_steps", "num_layers", "heads", "head_dim", "n",
                                                            "shard_size", "chunk_tokens", "anchor_group")},
                           "levels": [[list(k), list(v)] for k, v in geo.levels]},
              "scheme": "per-token max-abs, layer-group bins, range coding with per-(layer,kind,channel) u16 model",
              "shards": [list(s) for s in plan]}
    write_container(path, header, chunks)
    return CacheGenReader(path).info


class CacheGenInfo(StoredInfo):
    """Parsed CacheGen header: geometry, ranges of each (shard, chunk, level) and of each level's model."""

    magic, versions = FORMAT, (VERSION,)

    def __init__(self, header: dict[str, Any], index):
        super().__init__(header, index)
        try:
            g = dict(header["geometry"])
            g["levels"] = tuple((tuple(k), tuple(v)) for k, v in g["levels"])
            self.geometry = CacheGenGeometry(**g)
            self.shards = [tuple(s) for s in header["shards"]]
        except (KeyError, TypeError, ValueError) as e:
            raise PackFormatError(f"CacheGen header is invalid: {e}") from None
        geo = self.geometry
        if self.shards != shard_plan(geo.num_steps, geo.num_layers, geo.shard_size):
            raise PackFormatError("shard list does not match the geometry")
        if len(index) != self.num_levels * (1 + len(self.shards) * len(geo.token_chunks())):
            raise PackFormatError("CacheGen index has the wrong number of chunks")

    @property
    def num_levels(self) -> int:
        return len(self.geometry.levels)

    @property
    def num_chunks(self) -> int:
        return len(self.geometry.token_chunks())

    def chunk_id(self, shard: int, chunk: int, level: int) -> int:
        if not (0 <= shard < self.num_shards and 0 <= chunk < self.num_chunks and 0 <= level < self.num_levels):
            raise PackFormatError(f"no CacheGen chunk (shard {shard}, chunk {chunk}, level {level})")
        return self.num_levels + (shard * self.num_chunks + chunk) * self.num_levels + level

    def ranges(self, shard: int, chunk: int, level: int) -> list[Range]:
        return [self.index.span(self.chunk_id(shard, chunk, level))]

    def model_ranges(self, level: int) -> list[Range]:
        """The level's entropy model: fetched once per edit before any chunk of that level."""
        if not 0 <= level < self.num_levels:
            raise PackFormatError(f"no CacheGen level {level}")
        return [self.index.span(level)]

    def chunk_bytes(self, shard: int, chunk: int, level: int) -> int:
        return self.index.span(self.chunk_id(shard, chunk, level))[1]

    def storage_bytes(self, level: int | None = None) -> int:
        """Bytes on disk of one level (its model + all its chunks), or of the whole file."""
        if level is None:
            return self.index.file_size
        return self.model_ranges(level)[0][1] + sum(
            self.chunk_bytes(s, c, level) for s in range(self.num_shards) for c in range(self.num_chunks))


class CacheGenReader:
    def __init__(self, path: str | Path):
        self.file, self.info = CacheGenInfo.open(path)

    def read(self, shard: int, levels: Sequence[int]) -> dict[Range, bytes]:
        """Bytes for a whole shard with ``levels[chunk]`` per token chunk, plus those levels' models."""
        ranges = [r for lv in sorted(set(levels)) for r in self.info.model_ranges(lv)]
        ranges += [r for c, lv in enumerate(levels) for r in self.info.ranges(shard, c, lv)]
        return self.file.read_ranges(ranges)

    def decode(self, shard: int, levels: Sequence[int], **kw) -> KV:
        return decode(self.info, shard, levels, self.read(shard, levels), **kw)


def decode_chunk(info: CacheGenInfo, shard: int, chunk: int, level: int, data: bytes, model: bytes
                 ) -> dict[CacheUnit, np.ndarray]:
    """Rows ``[t0, t1)`` of every cache unit of a shard, float32 (T, d), from one chunk and its level's model."""
    geo = info.geometry
    t0, t1 = geo.token_chunks()[chunk]
    anchors = geo.anchors(t0, t1)
    na, nd = int(anchors.sum()), int((~anchors).sum())
    units = shard_units(*info.shards[shard])
    nu = len(units)
    table = np.frombuffer(model, dtype="<u2").reshape(geo.num_layers, 2, geo.d, geo.symbols(level))
    raw = np.frombuffer(data, dtype=np.uint8)
    head = nu * nd * 2 + nu * na * 2 + nu * na * geo.d
    if len(raw) < head or (len(raw) - head) % 4:
        raise PackFormatError(f"CacheGen chunk has a bad length ({len(raw)} bytes)")
    scales = raw[:nu * nd * 2].view("<f2").reshape(nu, nd).astype(np.float32)
    a_scales = raw[nu * nd * 2:nu * (nd + na) * 2].view("<f2").reshape(nu, na).astype(np.float32)
    a_codes = raw[nu * (nd + na) * 2:head].view(np.int8).reshape(nu, na, geo.d).astype(np.float32)
    dec = constriction.stream.queue.RangeDecoder(np.ascontiguousarray(raw[head:]).view("<u4").astype(np.uint32))
    out = {}
    for k, (s, layer, kind) in enumerate(units):
        c = geo.bins(level, layer, kind) // 2 - 1
        freq = table[layer, "kv".index(kind)]
        sym = (np.stack([dec.decode(_model(freq[ch]), nd) for ch in range(geo.d)], axis=1) if nd
               else np.zeros((0, geo.d), np.int32))
        delta = (sym - c).astype(np.float32) * (scales[k][:, None] / c)
        x = np.empty((t1 - t0, geo.d), np.float32)
        a_hat = a_codes[k] * (a_scales[k][:, None] / ANCHOR_C)
        x[anchors] = a_hat
        x[~anchors] = delta + (a_hat[np.cumsum(anchors)[~anchors] - 1] if na else 0.0)
        out[(s, layer, kind)] = x
    return out


class ShardRows:
    """A shard's cache units filled in token chunk by token chunk; complete once every chunk is in."""

    def __init__(self, info: CacheGenInfo, shard: int):
        geo = info.geometry
        self.token_chunks = geo.token_chunks()
        self.units = {unit: torch.empty(geo.n, geo.d) for unit in shard_units(*info.shards[shard])}
        self.missing = set(range(len(self.token_chunks)))

    def add(self, chunk: int, rows: dict[CacheUnit, np.ndarray]) -> None:
        t0, t1 = self.token_chunks[chunk]
        for unit, x in rows.items():
            self.units[unit][t0:t1] = torch.from_numpy(x)
        self.missing.discard(chunk)

    def kv(self) -> KV:
        if self.missing:
            raise PackFormatError(f"token chunks {sorted(self.missing)} of the shard were never decoded")
        return kv_pairs(self.units)


def decode(info: CacheGenInfo, shard: int, levels: Sequence[int], blobs: Blobs, *, verify: bool = True) -> KV:
    """Rebuild a shard's K, V (n, d) float32 with ``levels[chunk]`` per token chunk, from received bytes."""
    if len(levels) != info.num_chunks:
        raise PackFormatError(f"need one level per token chunk ({info.num_chunks}), got {len(levels)}")
    used = sorted(set(levels))
    models = dict(zip(used, info.index.gather(used, blobs, verify=verify)))
    data = info.index.gather([info.chunk_id(shard, c, lv) for c, lv in enumerate(levels)], blobs, verify=verify)
    rows = ShardRows(info, shard)
    for c, lv in enumerate(levels):
        rows.add(c, decode_chunk(info, shard, c, lv, data[c], models[lv]))
    return rows.kv()


class CacheGenEncoding(StreamEncoding):
    """Fetch unit = one token chunk of one shard, at one of the stored levels; the entropy models of
    every level come first (the preamble). A shard is complete when all its chunks are decoded."""

    name = "cachegen"

    def __init__(self, info: CacheGenInfo):
        self.info = info
        self._units = []
        chunks = info.geometry.token_chunks()
        for shard_index, shard in enumerate(info.shards):
            for c, (t0, t1) in enumerate(chunks):
                levels = tuple(Level(f"L{lv}", info.chunk_bytes(shard_index, c, lv), float(info.num_levels - lv), (lv,))
                               for lv in range(info.num_levels))
                self._units.append(FetchUnit(len(self._units), shard_index,
                                             f"{shard_label(shard)} tokens {t0}-{t1 - 1}", levels))
        self._models: dict[int, bytes] = {}
        self._partial: dict[int, ShardRows] = {}

    @classmethod
    def from_header(cls, header: bytes) -> "CacheGenEncoding":
        return cls(CacheGenInfo.from_bytes(header))

    def fresh(self) -> "CacheGenEncoding":
        return CacheGenEncoding(self.info)

    @property
    def units(self):
        return self._units

    def preamble_ranges(self):
        return [r for lv in range(self.info.num_levels) for r in self.info.model_ranges(lv)]

    def set_preamble(self, blobs):
        levels = range(self.info.num_levels)  # model chunk i is level i's
        self._models = dict(zip(levels, self.info.index.gather(levels, dict(zip(self.preamble_ranges(), blobs)))))

    def ranges(self, fetch_unit, level):
        shard, chunk = self._locate(fetch_unit)
        return self.info.ranges(shard, chunk, *level.key)

    def _locate(self, fetch_unit: FetchUnit) -> tuple[int, int]:
        return fetch_unit.needed_by, fetch_unit.index % self.info.num_chunks

    def decode(self, fetch_unit, level, blobs) -> KV:
        shard, chunk = self._locate(fetch_unit)
        (lv,) = level.key
        received = dict(zip(self.ranges(fetch_unit, level), blobs))
        [data] = self.info.index.gather([self.info.chunk_id(shard, chunk, lv)], received)
        rows = self._partial.setdefault(shard, ShardRows(self.info, shard))
        rows.add(chunk, decode_chunk(self.info, shard, chunk, lv, data, self._models[lv]))
        if rows.missing:
            return {}
        return self._partial.pop(shard).kv()

    @property
    def storage_bytes(self):
        return self.info.storage_bytes()
