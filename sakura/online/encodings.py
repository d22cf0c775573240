"""The stream encodings (plug-ins) and a factory that builds one by name from its stored header."""

from __future__ import annotations

from abc import abstractmethod

import torch

from sakura.offline.cachegen import CacheGenInfo, decode_cachegen_chunk
from sakura.offline.container import PackFormatError
from sakura.offline.fp16 import Fp16Info, decode_fp16_shard
from sakura.offline.intq import IntQInfo, decode_intq_shard
from sakura.offline.pack import PackInfo, decode_shard, shard_units
from sakura.online.encoding import KV, FetchUnit, Level, StreamEncoding


def _shard_label(shard: tuple[int, int, int]) -> str:
    step, l0, l1 = shard
    return f"step {step} layers {l0}-{l1 - 1}"


class ShardEncoding(StreamEncoding):
    """Encodings whose fetch unit is one shard: subclasses say how levels map to ranges and decodes."""

    info_cls: type = object

    def __init__(self, info):
        self.info = info
        self._units = [FetchUnit(s, s, _shard_label(sh), self._levels(s)) for s, sh in enumerate(info.shards)]

    @classmethod
    def from_header(cls, header: bytes):
        return cls(cls.info_cls.from_bytes(header))

    @property
    def units(self):
        return self._units

    def decode(self, unit, level, blobs):
        return self._decode(unit.index, level.key, dict(zip(self.ranges(unit, level), blobs)))

    @abstractmethod
    def _levels(self, shard: int) -> tuple[Level, ...]: ...

    @abstractmethod
    def _decode(self, shard: int, key: tuple, blobs: dict) -> KV: ...


class SakuraPackEncoding(ShardEncoding):
    """One progressive pack; fetch unit = shard; levels = its rank–precision frontier. The rebuild
    can be delegated to a reconstructor backend (torch / OpenCL: ``sakura.runtime.reconstruct``)."""

    name, info_cls = "sakura", PackInfo
    reconstructor = None  # anything with .rebuild(info, shard, r, b_a, b_b, blobs) -> {(step, layer): (K, V)}

    def _levels(self, shard):
        frontier = self.info.frontier(shard)
        if not frontier:
            raise PackFormatError(f"pack for {self.info.template_id} has no trade-off profile for shard {shard}")
        return tuple(Level(f"r{c.r}/a{c.b_a}/b{c.b_b}", c.bytes, c.error, c.key) for c in frontier)

    def ranges(self, unit, level):
        return self.info.ranges(unit.index, *level.key)

    def _decode(self, shard, key, blobs):
        if self.reconstructor is not None:
            return self.reconstructor.rebuild(self.info, shard, *key, blobs)
        return decode_shard(self.info, shard, *key, blobs)

    @property
    def storage_bytes(self):
        return self.info.file_size


class Fp16Encoding(ShardEncoding):
    name, info_cls = "fp16", Fp16Info

    def _levels(self, shard):
        return (Level("fp16", self.info.ranges(shard)[0][1], 0.0, ()),)

    def ranges(self, unit, level):
        return self.info.ranges(unit.index)

    def _decode(self, shard, key, blobs):
        return decode_fp16_shard(self.info, shard, blobs)

    @property
    def storage_bytes(self):
        return self.info.storage_bytes


class IntQEncoding(ShardEncoding):
    """Every stored width is a level; the IntQ policy picks one for the whole edit."""

    name, info_cls = "intq", IntQInfo

    def _levels(self, shard):
        return tuple(Level(f"int{b}", self.info.config_bytes(shard, b), 1.0 / 2**b, (b,)) for b in sorted(self.info.bits))

    def ranges(self, unit, level):
        return self.info.ranges(unit.index, *level.key)

    def _decode(self, shard, key, blobs):
        return decode_intq_shard(self.info, shard, *key, blobs)

    @property
    def storage_bytes(self):
        return self.info.storage_bytes()


class CacheGenEncoding(StreamEncoding):
    """Fetch unit = one token chunk of one shard, at one of the stored levels; the entropy models of
    every level come first (the preamble). A shard is complete when all its chunks are decoded."""

    name = "cachegen"

    def __init__(self, info: CacheGenInfo):
        self.info = info
        self._units = []
        chunks = info.geometry.token_chunks()
        for s, sh in enumerate(info.shards):
            for c, (t0, t1) in enumerate(chunks):
                levels = tuple(Level(f"L{lv}", info.chunk_bytes(s, c, lv), float(info.num_levels - lv), (lv,))
                               for lv in range(info.num_levels))
                self._units.append(FetchUnit(len(self._units), s, f"{_shard_label(sh)} tokens {t0}-{t1 - 1}",
                                             levels))
        self._models: dict[int, bytes] = {}
        self._partial: dict = {}

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
        for lv, blob in enumerate(blobs):
            i = lv
            self.info.index.check(i, blob)
            self._models[lv] = blob

    def ranges(self, unit, level):
        shard, chunk = self._locate(unit)
        return self.info.ranges(shard, chunk, *level.key)

    def _locate(self, unit: FetchUnit) -> tuple[int, int]:
        return unit.needed_by, unit.index % self.info.num_chunks

    def decode(self, unit, level, blobs) -> KV:
        shard, chunk = self._locate(unit)
        (lv,) = level.key
        cid = self.info.chunk_id(shard, chunk, lv)
        self.info.index.check(cid, blobs[0])
        rows = decode_cachegen_chunk(self.info, shard, chunk, lv, blobs[0], self._models[lv])
        geo = self.info.geometry
        t0, t1 = geo.token_chunks()[chunk]
        parts = self._partial.setdefault(shard, {"left": self.info.num_chunks, "units": {}})
        for u, x in rows.items():
            parts["units"].setdefault(u, torch.empty(geo.n, geo.d))[t0:t1] = torch.from_numpy(x)
        parts["left"] -= 1
        if parts["left"]:
            return {}
        done = self._partial.pop(shard)["units"]
        out: dict = {}
        for (s, layer, kind) in shard_units(*self.info.shards[shard]):
            out.setdefault((s, layer), {})[kind] = done[(s, layer, kind)]
        return {key: (kv["k"], kv["v"]) for key, kv in out.items()}

    @property
    def storage_bytes(self):
        return self.info.storage_bytes()


ENCODINGS: dict[str, type[StreamEncoding]] = {
    "sakura": SakuraPackEncoding, "fp16": Fp16Encoding, "intq": IntQEncoding, "cachegen": CacheGenEncoding}


def encoding_from_header(name: str, header: bytes) -> StreamEncoding:
    """Build the named encoding from the raw header bytes (``8 + N``) of its stored file."""
    if name not in ENCODINGS:
        raise KeyError(f"unknown encoding {name!r}; known: {', '.join(ENCODINGS)}")
    return ENCODINGS[name].from_header(header)  # type: ignore[attr-defined]
