"""IntQ baseline: uniform integer quantisation of the K/V cache, one bit width for the whole edit.

Per cache unit (step, layer, K|V) and per channel, asymmetric min/max quantisation (the standard
KV-cache scheme: channels differ in range and offset, tokens within a channel much less):

    scale_c = (max_c − min_c) / (2^b − 1),  q = round((x − min_c) / scale_c),  x̂ = min_c + q · scale_c

with min and scale stored as float16 (codes are computed against the rounded values so encode and
decode agree). Codes are bit-packed densely (b bits per value, MSB first), so b = 3 really costs 3
bits. The stored file holds every bit width of {2, 3, 4, 8}; the client fetches, per shard, the one
chunk of the width chosen for the edit (the same shard granularity as SAKURA).

Chunk order: for each bit width, for each shard: [per cache unit: min (d × f2), scale (d × f2), codes].
Fetch unit = shard; every stored width is a level.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from sakura.formats.base import KV, Level, Range, ShardEncoding
from sakura.formats.container import (
    Blobs,
    PackFormatError,
    StoredInfo,
    check_lengths,
    checked_plan,
    geometry_ints,
    write_container,
)
from sakura.kvcache import KVCache, kv_pairs, shard_plan, shard_units

FORMAT = "sakura-intq"
VERSION = 1
SUFFIX = ".intq"
DEFAULT_BITS = (2, 3, 4, 8)

if TYPE_CHECKING:
    import torch  # imported inside the functions that make tensors, not here: see sakura.kvcache


def unit_bytes(n: int, d: int, bits: int) -> int:
    """Bytes of one encoded (n, d) cache unit at ``bits``: 2 × d float16 + ⌈n·d·bits / 8⌉ packed codes."""
    return 4 * d + (n * d * bits + 7) // 8


def encode_unit(x: torch.Tensor, bits: int) -> bytes:
    """Quantise one (n, d) cache unit per channel to ``bits`` and pack it (see :func:`unit_bytes`)."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be 1..8, got {bits}")
    xd = x.detach().float().numpy().astype(np.float64)  # (torch's fp16→fp64 cast is slow on CPU)
    lo = xd.min(axis=0).astype(np.float16)
    scale = ((xd.max(axis=0) - lo.astype(np.float64)) / ((1 << bits) - 1)).astype(np.float16)
    s = scale.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(s > 0, np.round((xd - lo.astype(np.float64)) / np.where(s > 0, s, 1.0)), 0.0)
    q = np.clip(q, 0, (1 << bits) - 1).astype(np.uint8)
    packed = np.packbits(np.unpackbits(q.reshape(-1, 1), axis=1)[:, 8 - bits:])
    return lo.astype("<f2").tobytes() + scale.astype("<f2").tobytes() + packed.tobytes()


def decode_unit(buf: bytes, n: int, d: int, bits: int) -> torch.Tensor:
    """Inverse of :func:`encode_unit` → float32 (n, d)."""
    import torch

    if len(buf) != unit_bytes(n, d, bits):
        raise PackFormatError(f"IntQ unit: {len(buf)} bytes, expected {unit_bytes(n, d, bits)}")
    raw = np.frombuffer(buf, dtype=np.uint8)
    lo = raw[:2 * d].view("<f2").astype(np.float32)
    scale = raw[2 * d:4 * d].view("<f2").astype(np.float32)
    bitarr = np.unpackbits(raw[4 * d:], count=n * d * bits).reshape(n * d, bits)
    q = (bitarr.astype(np.uint32) << np.arange(bits - 1, -1, -1, dtype=np.uint32)).sum(axis=1)
    return torch.from_numpy(lo + q.reshape(n, d).astype(np.float32) * scale)


class IntQInfo(StoredInfo):
    """Parsed IntQ header: geometry, shards, stored widths, ranges."""

    magic, versions = FORMAT, (VERSION,)

    def __init__(self, header: dict[str, Any], index):
        super().__init__(header, index)
        g = geometry_ints(header, ("num_steps", "num_layers", "heads", "head_dim", "n", "shard_size"), "IntQ")
        self.n, self.d = g["n"], g["heads"] * g["head_dim"]
        bits = header.get("bits")
        if not (isinstance(bits, list) and bits and all(type(b) is int and 1 <= b <= 8 for b in bits)
                and len(set(bits)) == len(bits)):
            raise PackFormatError("IntQ header: bits must be a list of distinct widths in 1..8")
        self.bits = bits
        self.shards = checked_plan(header, index, g, len(bits), shard_plan, "IntQ")
        check_lengths(index, [2 * (l1 - l0) * unit_bytes(self.n, self.d, b) for b in bits for _, l0, l1 in self.shards],
                      "IntQ")

    def chunk(self, shard: int, bits: int) -> int:
        if bits not in self.bits or not 0 <= shard < len(self.shards):
            raise PackFormatError(f"IntQ has no (shard {shard}, {bits} bits); widths {self.bits}")
        return self.bits.index(bits) * len(self.shards) + shard

    def ranges(self, shard: int, bits: int) -> list[Range]:
        return [self.index.span(self.chunk(shard, bits))]

    def config_bytes(self, shard: int, bits: int) -> int:
        return self.index.span(self.chunk(shard, bits))[1]

    def storage_bytes(self, bits: int | None = None) -> int:
        """Bytes on disk of one width (or the whole file)."""
        if bits is None:
            return self.index.file_size
        return sum(self.config_bytes(s, bits) for s in range(self.num_shards))


def write_intq(path: str | Path, cache: KVCache, *, bits: Sequence[int] = DEFAULT_BITS, shard_size: int = 1,
               model_id: str = "", template_id: str = "") -> IntQInfo:
    chunks = []
    plan = shard_plan(cache.num_steps, cache.num_layers, shard_size)
    for b in bits:
        for shard in plan:
            chunks.append(b"".join(encode_unit(cache.unit(*unit), b) for unit in shard_units(*shard)))
    header = {"format": FORMAT, "version": VERSION, "model_id": model_id, "template_id": template_id,
              "geometry": {"num_steps": cache.num_steps, "num_layers": cache.num_layers, "heads": cache.heads,
                           "head_dim": cache.head_dim, "n": cache.num_reused, "shard_size": shard_size},
              "scheme": "per-channel asymmetric min/max, f2 min+scale, dense MSB-first bit packing",
              "bits": list(bits), "shards": [list(s) for s in plan]}
    write_container(path, header, chunks)
    return IntQReader(path).info


class IntQReader:
    def __init__(self, path: str | Path):
        self.file, self.info = IntQInfo.open(path)

    def read(self, shard: int, bits: int) -> dict[Range, bytes]:
        return self.file.read_ranges(self.info.ranges(shard, bits))

    def decode(self, shard: int, bits: int, **kw) -> KV:
        return decode(self.info, shard, bits, self.read(shard, bits), **kw)


def decode(info: IntQInfo, shard: int, bits: int, blobs: Blobs, *, verify: bool = True) -> KV:
    """K, V (n, d) float32 of every (step, layer) of a shard at width ``bits``, from received bytes."""
    [data] = info.index.gather([info.chunk(shard, bits)], blobs, verify=verify)
    size = unit_bytes(info.n, info.d, bits)
    return kv_pairs({unit: decode_unit(data[k * size:(k + 1) * size], info.n, info.d, bits)
                     for k, unit in enumerate(shard_units(*info.shards[shard]))})


class IntQEncoding(ShardEncoding):
    """Every stored width is a level; the IntQ policy picks one for the whole edit."""

    name, info_cls = "intq", IntQInfo

    def _levels(self, shard):
        return tuple(
            Level(f"int{b}", self.info.config_bytes(shard, b), 1.0 / 2**b, (b,)) for b in sorted(self.info.bits)
        )

    def ranges(self, fetch_unit, level):
        return self.info.ranges(fetch_unit.index, *level.key)

    def _decode(self, shard, key, blobs):
        return decode(self.info, shard, *key, blobs)

    @property
    def storage_bytes(self):
        return self.info.storage_bytes()
