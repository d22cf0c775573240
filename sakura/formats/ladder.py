"""Version 3 of the SAKURA pack: the version-2 pack plus a ladder of rungs that reaches the exact cache.

The allocated levels of a v2 pack stop at a target error (the pack's top quality); on a link fast enough
for more, the device had nothing better to fetch. Version 3 adds, per shard, above its allocated chunks:

* **residual rungs**: the shard's FP16 values minus its top allocated level, quantised per unit and
  channel to 8 bits (``step = max|r| / 128``, offset-binary code ``c = ⌊r / step⌋ + 128``) and stored as
  bit planes, MSB first (planes ≥ 1 as magnitudes, zstd-coded where it pays, as v2's planes), right
  after the shard's allocated chunks (layout kind ``0x20 | plane``, ``0x80`` when coded). Rung
  ``p`` is the top level plus the first ``p`` planes — one contiguous range, nested in every larger
  rung (anytime shards unchanged); a truncated code rebuilds at the centre of its remaining interval.
  Plane 0's chunk starts with the ``(U, d)`` float32 steps.
* **the exact rung**: the FP16 values themselves, which are *not stored twice*: the header names the
  template's FP16 file (``ladder.fp16``: file id, size, and per shard its chunk's offset, length and
  CRC32) and the rung's ranges are that file's, read at offsets ``base + offset`` — a
  :class:`~sakura.formats.base.FileRef` the device's source resolves (:mod:`sakura.net.refs`).

Keys stay ``(k,)``: ``k ≤ allocated`` is a v2 level; ``allocated < k ≤ allocated + planes`` the residual
rung of ``k − allocated`` planes; ``k = allocated + planes + 1`` the exact rung. Every rung is a row of the
pack's own trade-off profile (``tradeoff.frontiers``, the same ``[k, bytes, error]`` rows, the same error
metric), so the allocator, the policy, anytime cuts and rebuild pricing read them like any level.
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sakura.formats import allocated, chunkcodec
from sakura.formats.base import FileRef
from sakura.formats.container import (
    Blobs,
    ByteSource,
    ChunkChecksumError,
    ContainerFile,
    PackFormatError,
    write_container,
)
from sakura.formats.fp16 import Fp16Info
from sakura.formats.pack import FORMAT, LAYOUTS, Config, Layout, PackInfo, PackReader

VERSION = 3
RUNG = 0x20  # layout kind of a residual plane chunk (low nibble: the plane, MSB first)
PLANES = 8  # residual planes stored (8-bit codes)
REF_BASE = 1 << 40  # offsets at or above this name the referenced FP16 file's bytes (offset − base)
# Rebuild work of a rung, in the multiply-accumulates ``Level.work`` counts (what the policy prices with
# the rebuild rate it learns from low-rank rebuilds): per value and plane of a residual (unpacking a
# plane and adding the dequantised residual), per value of the exact rung (CRC32, float16 → float32). Measured
# against the batched ``A·B`` of the allocated levels on this machine kind: docs/results/issue34.
RESIDUAL_WORK_PER_VALUE_PLANE = 10.0
EXACT_WORK_PER_VALUE = 24.0


@dataclass(frozen=True)
class RungConfig(allocated.PrefixConfig):
    """A rung above the allocated levels: ``planes`` residual planes (0 = the exact rung)."""

    planes: int = 0
    top_work: float = 0.0  # the top allocated level's work (a residual rung rebuilds it first)

    @property
    def rung(self) -> str:
        return f"res{self.planes}" if self.planes else "exact"

    def rebuild_work(self, units: int, n: int, d: int) -> float:
        values = float(units * n * d)
        if not self.planes:
            return values * EXACT_WORK_PER_VALUE
        return self.top_work + values * self.planes * RESIDUAL_WORK_PER_VALUE_PLANE


# ------------------------------------------------------------------------------------- residual codec
def plane_length(units: int, n: int, d: int) -> int:
    return -(-units * n * d // 8)


def rung_length(units: int, n: int, d: int, plane: int) -> int:
    """Raw bytes of residual plane ``plane``'s chunk (plane 0 carries the ``(U, d)`` float32 steps)."""
    return plane_length(units, n, d) + (units * d * 4 if plane == 0 else 0)


def encode_residual(residual: np.ndarray, planes: int = PLANES) -> list[bytes]:
    """``(U, n, d)`` residual → its raw plane chunks (MSB first; plane 0 led by the per-(unit, channel) steps;
    planes ≥ 1 in magnitude form, :func:`chunkcodec.to_magnitude`: most residuals are far below their
    channel's largest, so their high magnitude planes are nearly all zero and code small)."""
    r = np.asarray(residual, np.float64)
    step = (np.abs(r).max(axis=1) / 128).astype(np.float32)  # (U, d)
    safe = np.where(step > 0, step, 1.0)[:, None, :]
    codes = np.where(step[:, None, :] > 0, np.floor(r / safe) + 128, 128).clip(0, 255).astype(np.uint8)
    out, sign = [], None
    for p in range(planes):
        bits = np.packbits(((codes >> (7 - p)) & 1).ravel())
        if p == 0:
            sign = bits
            out.append(step.astype("<f4").tobytes() + bits.tobytes())
        else:
            out.append(chunkcodec.to_magnitude(bits, sign).tobytes())
    return out


def decode_residual(chunks: Sequence[bytes], units: int, n: int, d: int) -> np.ndarray:
    """The first ``len(chunks)`` planes → ``(U, n, d)`` float32, each code at the centre of its interval."""
    head = units * d * 4
    step = np.frombuffer(chunks[0][:head], "<f4").reshape(units, 1, d)
    count = units * n * d
    codes = np.zeros(count, np.uint8)
    sign = np.frombuffer(chunks[0], np.uint8, offset=head)
    for p, chunk in enumerate(chunks):
        packed = sign if p == 0 else chunkcodec.from_magnitude(np.frombuffer(chunk, np.uint8), sign)
        codes = (codes << 1) | np.unpackbits(packed, count=count)
    shift = PLANES - len(chunks)
    centre = (codes.astype(np.float32) * (1 << shift) + (1 << shift) / 2 - 128).reshape(units, n, d)
    return centre * step


# ---------------------------------------------------------------------------------------------- header
class LadderPackInfo(allocated.AllocatedPackInfo):
    """A version-3 pack header: a v2 header, each shard's residual planes after its allocated chunks, and
    the reference to the FP16 file whose byte ranges are the exact rung."""

    def __init__(self, header: dict[str, Any], index):  # noqa: D107 - parsed and checked field by field
        self._rungs: list[int] = []
        super().__init__(header, index)
        self._ref, self._exact = self._parse_reference(header)

    def _shard_refs(self, layout: np.ndarray, units: int, first: int, shared: bool):
        kinds, groups = layout[0::2], layout[1::2]
        rung = (kinds & RUNG).astype(bool) & ~(kinds & allocated.MEAN).astype(bool)
        plain = kinds & ~np.uint8(allocated.CODED)  # (a residual plane may be zstd-coded too)
        n_rung = len(kinds) - int(np.flatnonzero(~rung)[-1]) - 1
        if rung[:len(kinds) - n_rung].any():
            raise PackFormatError(f"pack v3 shard at chunk {first}: residual planes must follow its allocated chunks")
        if not 1 <= n_rung <= PLANES:
            raise PackFormatError(f"pack v3 shard at chunk {first} stores {n_rung} residual planes (1..{PLANES})")
        refs = super()._shard_refs(layout[:2 * (len(kinds) - n_rung)], units, first, shared)
        g = self.geometry
        for p, i in enumerate(range(len(kinds) - n_rung, len(kinds))):
            cid = first + i
            if plain[i] != RUNG | p or groups[i] != 0:
                raise PackFormatError(f"pack v3 chunk {cid} is out of order (residual plane {p} expected)")
            self._raw[cid] = rung_length(units, g.n, g.d, p)
            stored = int(self.index.lengths[cid])
            if stored != self._raw[cid] if not self._coded[cid] else not 0 < stored < self._raw[cid]:
                raise PackFormatError(f"pack chunk index does not match the geometry at chunk {cid}")
        self._rungs.append(n_rung)
        return refs

    def _parse_reference(self, header: dict[str, Any]) -> tuple[FileRef, list[tuple[int, int, int]]]:
        lad = header.get("ladder")
        ref = lad.get("fp16") if isinstance(lad, dict) else None
        try:
            if not isinstance(ref, dict):
                raise ValueError
            fid, base, size, exact = ref["file_id"], ref["base"], ref["file_size"], ref["shards"]
            if (not isinstance(fid, str) or not fid or any(type(v) is not int for v in (base, size))
                    or not self.file_size <= base < 1 << 50 or not 0 < size < 1 << 48
                    or not isinstance(exact, list) or len(exact) != self.num_shards):
                raise ValueError
            out = []
            for s, row in enumerate(exact):
                off, length, crc = row
                if (any(type(v) is not int for v in row) or off < 0 or off + length > size
                        or length != 2 * len(self.units(s)) * self.geometry.n * self.geometry.d
                        or not 0 <= crc < 1 << 32):
                    raise ValueError
                out.append((off, length, crc))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise PackFormatError("pack v3 header's ladder.fp16 must name the FP16 file (file_id, base at or past "
                                  "the pack's end, file_size) and per shard its [offset, length, crc32]") from None
        return FileRef(fid, base, size), out

    @property
    def version(self) -> int:
        return VERSION

    @property
    def references(self) -> list[FileRef]:
        return [self._ref]

    def allocated_count(self, shard: int) -> int:
        return len(self._refs[shard])

    def exact_k(self, shard: int) -> int:
        return len(self._refs[shard]) + self._rungs[shard] + 1

    def is_rung(self, shard: int, key: tuple) -> bool:
        return key[0] > len(self._refs[shard])

    def level_for(self, shard: int, r: int, b_a: int, b_b: int) -> tuple:
        """As a v2 pack's, among the allocated levels: v1's configurations compare to those, not to the ladder."""
        key = super().level_for(shard, r, b_a, b_b)
        return (len(self._refs[shard]),) if self.is_rung(shard, key) else key

    def is_reference(self, shard: int, key: tuple) -> bool:
        return key[0] == self.exact_k(shard)

    def validate(self, shard: int, k: int, *rest) -> None:  # type: ignore[override]
        if not 0 <= shard < self.num_shards:
            raise PackFormatError(f"shard {shard} out of range (pack has {self.num_shards})")
        if rest or type(k) is not int or not 0 <= k <= self.exact_k(shard):
            raise PackFormatError(f"level {(k, *rest)} invalid: a v3 pack level is a chunk count "
                                  f"0..{self.exact_k(shard) - 1} or {self.exact_k(shard)} (exact)")

    def chunks(self, shard: int, k: int, *rest) -> list[int]:  # type: ignore[override]
        self.validate(shard, k, *rest)
        if k == self.exact_k(shard):
            raise PackFormatError(f"level {k} of shard {shard} is the FP16 file's bytes, not this pack's chunks")
        return list(range(self._base[shard], self._base[shard] + 1 + k))

    def ranges(self, shard: int, *key: int):
        self.validate(shard, *key)
        if key[0] == self.exact_k(shard):
            off, length, _ = self._exact[shard]
            return [(self._ref.base + off, length)]
        return super().ranges(shard, *key)

    def refs(self, shard: int, k: int):
        self.validate(shard, k)
        return self._refs[shard][:min(k, len(self._refs[shard]))]

    def allocation(self, shard: int, k: int):
        return super().allocation(shard, min(k, len(self._refs[shard])))

    def exact_span(self, shard: int) -> tuple[int, int, int]:
        """``(offset, length, crc32)`` of ``shard``'s chunk in the FP16 file."""
        return self._exact[shard]

    def _is_rung_row(self, shard: int, row) -> bool:
        return isinstance(row, list) and len(row) == 3 and type(row[0]) is int and row[0] > len(self._refs[shard])

    def _frontier_rows(self, shard: int):
        """The allocated levels' rows (the v2 parser reads these; the rung rows follow them)."""
        rows = super()._frontier_rows(shard)
        if rows is None:
            return None
        if not isinstance(rows, list):
            raise PackFormatError(f"pack frontier of shard {shard} is malformed")
        return [r for r in rows if not self._is_rung_row(shard, r)]

    def _parse_frontier(self, shard: int) -> list[Config]:
        front = super()._parse_frontier(shard)
        rows = super()._frontier_rows(shard) or []
        rungs = [r for r in rows if self._is_rung_row(shard, r)]
        if rows[len(rows) - len(rungs):] != rungs or (rungs and not front):
            raise PackFormatError(f"pack ladder rows of shard {shard} must follow its allocated levels' rows")
        if not rungs:
            return front
        top, g = front[-1], self.geometry
        top_work = top.rebuild_work(len(self.units(shard)), g.n, g.d)
        out, last = [], top
        try:
            for k, nbytes, err in rungs:
                planes = 0 if k == self.exact_k(shard) else k - len(self._refs[shard])
                if (type(k) is not int or not last.k < k <= self.exact_k(shard)
                        or nbytes != self.config_bytes(shard, k) or not 0 <= float(err) < last.error):
                    raise ValueError
                last = RungConfig(top.r, top.b_a, top.b_b, int(nbytes), float(err), k, planes, top_work)
                out.append(last)
        except (TypeError, ValueError, OverflowError, PackFormatError):
            raise PackFormatError(f"pack ladder rows of shard {shard} are malformed") from None
        return front + out

    def storage(self) -> dict[str, int]:
        """Bytes stored: ``pack`` (the allocated levels alone, header included), ``rungs`` (the residual
        planes in this file) and ``fp16`` (the referenced FP16 file the exact rung reads)."""
        rung_bytes = sum(int(self.index.lengths[self._base[s] + 1 + len(self._refs[s]) + p])
                         for s in range(self.num_shards) for p in range(self._rungs[s]))
        return {"pack": self.file_size - rung_bytes, "rungs": rung_bytes, "fp16": self._ref.size}


# ------------------------------------------------------------------------------------------------ decode
def received_residual(info: LadderPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True) -> np.ndarray:
    """The residual of rung ``k`` (``(U, n, d)`` float32) from its plane chunks, each CRC-checked."""
    first = info._base[shard] + 1 + info.allocated_count(shard)
    ids = list(range(first, info._base[shard] + 1 + k))
    data = [chunkcodec.decode(stored, *info.stored_chunk(cid), f"chunk {cid}")
            for cid, stored in zip(ids, info.index.gather(ids, blobs, verify=verify))]
    g = info.geometry
    return decode_residual(data, len(info.units(shard)), g.n, g.d)


def exact_values(info: LadderPackInfo, shard: int, blobs: Blobs, *, verify: bool = True) -> np.ndarray:
    """The exact rung: the FP16 file's chunk of ``shard`` → ``(U, n, d)`` float32 (CRC-checked)."""
    off, length, crc = info.exact_span(shard)
    data = ByteSource(blobs).get(info.references[0].base + off, length)
    if verify and zlib.crc32(data) != crc:
        raise ChunkChecksumError(f"checksum mismatch: the FP16 bytes of shard {shard} do not match the CRC32 "
                                 "the pack records")
    g = info.geometry
    return np.frombuffer(data, "<f2").reshape(len(info.units(shard)), g.n, g.d).astype(np.float32)


def decode_shard(info: LadderPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
    """``(units, K/V (U, n, d) float32 tensor)`` of level ``k``: a v2 level, the top level plus a residual,
    or the FP16 values."""
    import torch  # (torch: not for header-only readers such as the server)

    info.validate(shard, k)
    if k == info.exact_k(shard):
        return info.units(shard), torch.from_numpy(exact_values(info, shard, blobs, verify=verify))
    top = min(k, info.allocated_count(shard))
    units, kv = allocated.decode_shard(info, shard, top, blobs, verify=verify)
    if k > top:
        kv = kv + torch.from_numpy(received_residual(info, shard, k, blobs, verify=verify))
    return units, kv


def decode_factors(info: LadderPackInfo, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
    """Low-rank factors of an allocated level (a rung is not low-rank: :func:`decode_shard` rebuilds it)."""
    if info.is_rung(shard, (k,)):
        raise PackFormatError(f"level {k} of shard {shard} is a ladder rung: it has no low-rank factors")
    return allocated.decode_factors(info, shard, k, blobs, verify=verify)


# ------------------------------------------------------------------------------------------------ write
@dataclass
class LadderShard:
    """What the offline side hands :func:`write_ladder` for one shard: its residual plane chunks as stored
    (MSB first, :func:`encode_residual` then :func:`chunkcodec.encode`: bytes, coded?) and the error of the
    top level plus each plane count (same metric as the allocated frontier; a plane count no better than
    the level below it is stored but not offered)."""

    planes: list[tuple[bytes, bool]]
    errors: list[float]


def write_ladder(path: str | Path, base: str | Path, shards: Sequence[LadderShard], fp16_path: str | Path,
                 fp16_file_id: str) -> LadderPackInfo:
    """Write a v3 pack at ``path`` from the v2 pack ``base`` (its chunks kept byte for byte), each shard's
    residual planes, and a reference to the FP16 file at ``fp16_path`` (known to readers as
    ``fp16_file_id``) whose chunks are the exact rung. ``path`` may be ``base`` (replaced atomically)."""
    src = ContainerFile(base, FORMAT, (allocated.VERSION, VERSION))
    info = PackInfo(src.header, src.index)  # a v2 pack, or a v3 one whose ladder is replaced
    _, fp16 = Fp16Info.open(fp16_path)
    if fp16.shards != info.shards or (fp16.n, fp16.d) != (info.geometry.n, info.geometry.d):
        raise ValueError("the FP16 file's shard plan or geometry does not match the pack's")
    if len(shards) != info.num_shards:
        raise ValueError(f"{len(shards)} ladder shards for a pack of {info.num_shards}")
    header = {k: v for k, v in src.header.items() if k not in ("chunk_lengths", "chunk_crc32", "data_length")}
    layout = bytearray(base64.b64decode(header["layout"]))
    chunks, new_layout, counts, frontiers = [], bytearray(), [], []
    for s, lad in enumerate(shards):
        n_alloc = len(info._refs[s])  # (a v3 base: its allocated chunks only)
        ids = range(info._base[s], info._base[s] + 1 + n_alloc)
        chunks += [src.read(*info.index.span(i)) for i in ids]
        new_layout += layout[2 * ids[0]:2 * (ids[-1] + 1)]
        if not 1 <= len(lad.planes) <= PLANES or len(lad.errors) != len(lad.planes):
            raise ValueError(f"shard {s}: 1..{PLANES} residual planes, one error each")
        chunks += [stored for stored, _ in lad.planes]
        new_layout += bytes(b for p, (_, coded) in enumerate(lad.planes)
                            for b in (RUNG | p | (allocated.CODED if coded else 0), 0))
        counts.append(len(ids) + len(lad.planes))
        ends = np.cumsum([len(c) for c in chunks[-counts[-1]:]])
        rows = [list(r) for r in header["tradeoff"]["frontiers"][s] if r[0] <= n_alloc]
        for p, err in enumerate(lad.errors, start=1):  # only the rungs better than everything below them
            if float(f"{err:.4g}") < rows[-1][-1]:  # (one or two truncated planes can be worse than none)
                rows.append([n_alloc + p, int(ends[n_alloc + p]), float(f"{err:.4g}")])
        off, length = fp16.index.span(s)
        rows.append([n_alloc + len(lad.planes) + 1, int(length), 0.0])
        frontiers.append(rows)
    data_length = sum(len(c) for c in chunks)
    ref_base = max(REF_BASE, 1 << int(data_length + (1 << 20)).bit_length())  # past the file's end, with room
    header.update(version=VERSION, shard_chunks=counts, layout=base64.b64encode(bytes(new_layout)).decode("ascii"))
    header["tradeoff"] = {**header["tradeoff"], "frontiers": frontiers}
    header["ladder"] = {
        "residual": "per unit and channel <f4 step = max|r|/128; u8 code floor(r/step)+128; bit planes MSB first "
                    "(numpy packbits over the (U, n, d) codes); plane 0 led by the (U, d) steps",
        "fp16": {"file_id": fp16_file_id, "base": ref_base, "file_size": fp16.index.file_size,
                 "shards": [[*fp16.index.span(s), int(fp16.index.crcs[s])] for s in range(info.num_shards)]},
    }
    del src
    write_container(path, header, chunks)
    return PackReader(path).info  # type: ignore[return-value]


LAYOUTS[VERSION] = Layout(LadderPackInfo, write_ladder, decode_factors, decode_shard)
