"""The file container shared by every stored cache format (SAKURA packs, IntQ, CacheGen).

Layout (safetensors style, so a plain HTTP server or object store can serve it with ranges)::

    [8 bytes: N, little-endian u64][N bytes: UTF-8 JSON header, space padded][data: chunks back to back]

The header names the format (``"format"``, the magic) and its ``"version"``. The chunk index is
``"chunk_lengths"``, run-length encoded as ``[[length, count], ...]`` (regular layouts collapse to a
few runs), and ``"chunk_crc32"``, a base64 string of little-endian u32 CRC32s, one per chunk in file
order. Chunk ``i`` starts at ``data_start + sum(lengths[:i])`` where ``data_start = 8 + N``. Each format
defines what its chunks mean and in which order they come; this module only frames, indexes and
checks them. A client needs only the header bytes to compute every byte range and to verify each
chunk it receives against its CRC32: :meth:`ChunkIndex.gather` is the one place a decoder takes a
chunk out of the received bytes and checks it.

A header may be hostile (a corrupt file, a rogue server). Nothing is allocated by a size a header
states before that size has been checked against what the header itself holds: the chunk count
against the CRC list, the lengths against ``data_length`` and the file, each geometry field against
:data:`LIMITS`, and the chunk count a geometry implies against the index (:func:`header_ints`,
:func:`checked_plan`, :func:`check_lengths`; every format's header type calls them before it builds
anything sized by the header).
"""

from __future__ import annotations

import base64
import bisect
import json
import os
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pydantic_core

MAX_HEADER_BYTES = 16 << 20  # a sane bound so a corrupt length never makes a reader allocate GBs
MAX_FILE_BYTES = 1 << 40  # 1 TiB: far above any template's stored file
# Sane bounds of the geometry fields a format's header states (paper scale: 50 steps, 57 blocks,
# 24 × 128 heads, 4096 tokens). Products are bounded too: shards and per-unit sizes.
LIMITS: dict[str, tuple[int, int]] = {
    "num_steps": (1, 4096), "num_layers": (1, 4096), "shard_size": (1, 4096), "heads": (1, 4096),
    "head_dim": (1, 4096), "d": (1, 1 << 16), "n": (0, 1 << 20), "max_rank": (0, 1 << 16), "rank": (0, 1 << 16),
    "group": (1, 1 << 16), "planes": (1, 8), "chunk_tokens": (1, 1 << 20), "shared_basis": (0, 1),
}
MAX_LAYER_STEPS = 1 << 16  # num_steps × num_layers: cache units of one kind
MAX_UNIT_ELEMENTS = 1 << 26  # n × d of one cache unit (256 MB as float32)
Range = tuple[int, int]  # (offset, length) in the file
Blobs = Mapping[Range, bytes]  # bytes as received, keyed by the range they were fetched for


class PackFormatError(ValueError):
    """A stored cache file (or the bytes of one of its ranges) is malformed, or a request is invalid."""


class ChunkChecksumError(PackFormatError):
    """Received chunk bytes that fail their length or CRC32: damaged on the way or at the source (fetch them
    again, from another source if there is one), not a malformed pack."""


def encode_u32(values: Sequence[int] | np.ndarray) -> str:
    return base64.b64encode(np.asarray(values, dtype="<u4").tobytes()).decode("ascii")


def decode_u32(text: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except Exception as e:  # binascii.Error, UnicodeError
        raise PackFormatError(f"bad base64 in index: {e}") from None
    if len(raw) % 4:
        raise PackFormatError("index array length is not a multiple of 4 bytes")
    return np.frombuffer(raw, dtype="<u4").astype(np.int64)


def run_lengths(values: Sequence[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return runs


def expand_runs(runs: Any, count: int | None = None) -> np.ndarray:
    """Chunk lengths from ``[[length, count], ...]``; with ``count``, the runs must describe exactly
    that many chunks (checked before anything that size is allocated)."""
    if not isinstance(runs, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) for r in runs):
        raise PackFormatError("chunk_lengths is not a list of [length, count] integer pairs")
    if any(not 0 <= v <= MAX_FILE_BYTES or c < 0 for v, c in runs):
        raise PackFormatError(f"chunk length or count out of range (lengths 0..{MAX_FILE_BYTES}, counts >= 0)")
    total = sum(c for _, c in runs)
    if count is not None and total != count:
        raise PackFormatError(f"chunk_lengths describe {total} chunks, chunk_crc32 has {count}")
    return np.repeat(np.array([v for v, _ in runs], dtype=np.int64), np.array([c for _, c in runs], dtype=np.int64))


def crc32(data: bytes | memoryview | np.ndarray) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def header_text(header: dict[str, Any], chunks: Sequence[bytes], room: int = 0) -> bytes:
    """The JSON header of ``header`` + ``chunks`` (with their index), space padded to at least ``room`` bytes
    and to a multiple of 8 (the data 8-byte aligned, as safetensors does)."""
    header = dict(header)
    header["chunk_lengths"] = run_lengths([len(c) for c in chunks])
    header["chunk_crc32"] = encode_u32([crc32(c) for c in chunks])
    header["data_length"] = int(sum(len(c) for c in chunks))
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * max(0, room - len(text))
    return text + b" " * (-len(text) % 8)


def write_container(path: str | Path, header: dict[str, Any], chunks: Sequence[bytes], room: int = 0) -> int:
    """Write ``header`` + ``chunks`` atomically (temp file + rename). Returns the file size. ``room``: the
    least header length (:func:`header_text`): a header rewritten within it leaves every chunk's offset as it
    was, so a reader holding the old header still reads the right bytes."""
    text = header_text(header, chunks, room)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)
    return 8 + len(text) + sum(len(c) for c in chunks)


def loads_json(text: str | bytes) -> Any:
    """JSON from untrusted text: a ValueError (never a RecursionError) for anything malformed,
    including nesting deeper than a few hundred levels (pydantic-core's parser has that limit)."""
    return pydantic_core.from_json(text)


def header_ints(obj: Any, limits: Mapping[str, tuple[int, int]], what: str) -> dict[str, int]:
    """Integer fields of a header object, each within its ``(low, high)`` bound (see :data:`LIMITS`)."""
    if not isinstance(obj, Mapping):
        raise PackFormatError(f"{what} is not a JSON object")
    out = {}
    for key, (lo, hi) in limits.items():
        v = obj.get(key)
        if type(v) is not int or not lo <= v <= hi:
            shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:40] + "…"
            raise PackFormatError(f"{what}: {key} must be an integer in {lo}..{hi}, got {shown}")
        out[key] = v
    return out


def geometry_ints(header: Mapping[str, Any], keys: Sequence[str], what: str) -> dict[str, int]:
    """``header["geometry"]``'s fields ``keys``, each within :data:`LIMITS`, and their products
    (steps × layers, n × d) within :data:`MAX_LAYER_STEPS` / :data:`MAX_UNIT_ELEMENTS`."""
    g = header_ints(header.get("geometry"), {k: LIMITS[k] for k in keys}, f"{what} geometry")
    if g.get("num_steps", 1) * g.get("num_layers", 1) > MAX_LAYER_STEPS:
        raise PackFormatError(f"{what} geometry: num_steps × num_layers exceeds {MAX_LAYER_STEPS}")
    d = g["d"] if "d" in g else g.get("heads", 1) * g.get("head_dim", 1)
    if d > LIMITS["d"][1] or g.get("n", 1) * d > MAX_UNIT_ELEMENTS:
        raise PackFormatError(f"{what} geometry: a cache unit of {g.get('n')} × {d} exceeds the limits")
    return g


def checked_plan(header: Mapping[str, Any], index: "ChunkIndex", g: Mapping[str, int], chunks_per_shard: int,
                 shard_plan: Callable[[int, int, int], list], what: str,
                 extra_chunks: int = 0) -> list[tuple[int, int, int]]:
    """``shard_plan(num_steps, num_layers, shard_size)`` of geometry ``g``, built only once the index
    holds the ``shards × chunks_per_shard (+ extra_chunks`` outside the shards, e.g. tables``)`` chunks
    it implies (so a hostile geometry fails cheaply); the header's ``"shards"`` list must equal it."""
    num_shards = g["num_steps"] * -(-g["num_layers"] // g["shard_size"])
    if num_shards * chunks_per_shard + extra_chunks != len(index):
        raise PackFormatError(
            f"{what} index has {len(index)} chunks, its geometry implies "
            f"{num_shards} shards × {chunks_per_shard}" + (f" + {extra_chunks}" if extra_chunks else "")
        )
    shards = header.get("shards")
    if not isinstance(shards, list) or len(shards) != num_shards or not all(isinstance(s, list) for s in shards):
        raise PackFormatError(f"{what} shard list does not match the geometry")
    plan = shard_plan(g["num_steps"], g["num_layers"], g["shard_size"])
    if [tuple(s) for s in shards] != plan:
        raise PackFormatError(f"{what} shard list does not match the geometry")
    return plan


def check_lengths(index: "ChunkIndex", expected: Sequence[int], what: str) -> None:
    """The index's chunk lengths must be the ones the geometry implies (in file order)."""
    if len(expected) != len(index) or any(int(a) != b for a, b in zip(index.lengths, expected)):
        raise PackFormatError(f"{what} chunk index does not match the geometry (corrupt or foreign header)")


def header_size(first8: bytes) -> int:
    """Total bytes (8 + N) a client must fetch to hold the whole header, from the first 8 bytes."""
    if len(first8) < 8:
        raise PackFormatError("truncated: fewer than 8 bytes")
    n = int.from_bytes(first8[:8], "little")
    if n <= 1 or n > MAX_HEADER_BYTES:
        raise PackFormatError(f"bad magic: implausible header length {n}")
    return 8 + n


class ChunkIndex:
    """Absolute offsets, lengths and CRC32s of every chunk of one container, from its header."""

    def __init__(self, header: Mapping[str, Any], data_start: int):
        # The CRC list is as long as the header allows; the runs must match its length, and their sum
        # data_length, before the lengths are expanded (a run can claim 1e11 chunks in 20 bytes).
        if not isinstance(header.get("chunk_crc32"), str):
            raise PackFormatError("header has no valid chunk index: chunk_crc32 is missing")
        self.crcs = decode_u32(header["chunk_crc32"])
        runs = header.get("chunk_lengths")
        self.data_length = header_ints(header, {"data_length": (0, MAX_FILE_BYTES)}, "header")["data_length"]
        self.lengths = expand_runs(runs, len(self.crcs))
        if sum(v * c for v, c in runs) != self.data_length:
            raise PackFormatError("chunk lengths do not add up to data_length")
        self.data_start = data_start
        self.offsets = data_start + np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_length

    def span(self, i: int) -> tuple[int, int]:
        return int(self.offsets[i]), int(self.lengths[i])

    def check(self, i: int, data: bytes | memoryview | np.ndarray) -> None:
        if len(data) != self.lengths[i]:
            raise ChunkChecksumError(f"chunk {i}: got {len(data)} bytes, expected {int(self.lengths[i])}")
        if crc32(data) != self.crcs[i]:
            raise ChunkChecksumError(f"checksum mismatch in chunk {i} (offset {int(self.offsets[i])})")

    def gather(self, ids: Iterable[int], blobs: Blobs, *, verify: bool = True) -> list[bytes]:
        """The bytes of chunks ``ids`` out of received ``blobs`` (any blob covering a chunk will do),
        each checked against its length and CRC32 unless ``verify=False``."""
        source = ByteSource(blobs)
        out = []
        for i in ids:
            data = source.get(*self.span(i))
            if verify:
                self.check(i, data)
            out.append(data)
        return out


def parse_header(buf: bytes, fmt: str, versions: Sequence[int]) -> tuple[dict[str, Any], ChunkIndex]:
    """Parse and validate a header from the file's first bytes (at least :func:`header_size`)."""
    size = header_size(buf)
    if len(buf) < size:
        raise PackFormatError(f"truncated: header needs {size} bytes, have {len(buf)}")
    try:
        header = loads_json(bytes(buf[8:size]))
    except ValueError:
        raise PackFormatError("bad magic: header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != fmt:
        got = header.get("format") if isinstance(header, dict) else None
        raise PackFormatError(f"bad magic: expected format {fmt!r}, got {got!r}")
    if header.get("version") not in versions:
        raise PackFormatError(f"unsupported {fmt} version {header.get('version')!r} (supported: {list(versions)})")
    return header, ChunkIndex(header, size)


class ContainerFile:
    """A container on disk, memory-mapped read-only and validated against its header."""

    def __init__(self, path: str | Path, fmt: str, versions: Sequence[int]):
        self.path = Path(path)
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            hsize = header_size(f.read(8))
            if hsize > size:
                raise PackFormatError(f"truncated: header needs {hsize} bytes, file has {size}")
            f.seek(0)
            self.header_bytes = f.read(hsize)
        self.header, self.index = parse_header(self.header_bytes, fmt, versions)
        if size < self.index.file_size:
            raise PackFormatError(f"truncated: file has {size} bytes, header promises {self.index.file_size}")
        if size > self.index.file_size:
            raise PackFormatError(f"{size - self.index.file_size} trailing bytes after the last chunk")
        # numpy.memmap cannot map an empty data section; such a file is still valid (no chunks).
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r") if size else np.zeros(0, np.uint8)

    @property
    def size(self) -> int:
        return self.index.file_size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.size:
            raise PackFormatError(f"range {offset}+{length} outside the file ({self.size} bytes)")
        return self._mm[offset:offset + length].tobytes()

    def read_ranges(self, ranges: Sequence[Range]) -> dict[Range, bytes]:
        return {(o, n): self.read(o, n) for o, n in ranges}

    def verify(self) -> None:
        """Check every chunk's CRC32 (a full scan; readers otherwise check what they decode)."""
        for i in range(len(self.index)):
            o, n = self.index.span(i)
            self.index.check(i, self._mm[o:o + n])


class ByteSource:
    """Bytes received for some ranges, looked up by absolute offset (any covering blob will do)."""

    def __init__(self, blobs: Blobs):
        self._blobs = sorted((o, bytes(b) if not isinstance(b, bytes) else b) for (o, _), b in blobs.items())
        self._starts = [o for o, _ in self._blobs]

    def get(self, offset: int, length: int) -> bytes:
        # Blobs that start at or before ``offset``, nearest first; the first that covers the span wins.
        for i in range(bisect.bisect_right(self._starts, offset) - 1, -1, -1):
            start, blob = self._blobs[i]
            if start + len(blob) >= offset + length:
                return blob[offset - start: offset - start + length]
        raise PackFormatError(f"bytes {offset}+{length} were not supplied")


def coalesce(ranges: Sequence[Range]) -> list[Range]:
    """Sort ranges and merge the touching/overlapping ones (fewer parts in a multi-range request)."""
    out: list[list[int]] = []
    for o, n in sorted(ranges):
        if n <= 0:
            continue
        if out and o <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], o + n - out[-1][0])
        else:
            out.append([o, n])
    return [(o, n) for o, n in out]


class StoredInfo:
    """Base of every format's parsed header: the format's magic and versions, the header dict and
    chunk index, built from a client's header bytes or from a file on disk. Subclasses parse the rest."""

    magic: str = ""
    versions: tuple[int, ...] = ()
    shards: list[tuple[int, int, int]]

    def __init__(self, header: Mapping[str, Any], index: ChunkIndex):
        self.header, self.index = header, index

    @classmethod
    def from_bytes(cls, buf: bytes):
        """From the file's first :func:`header_size` bytes (more is fine)."""
        return cls(*parse_header(buf, cls.magic, cls.versions))

    @classmethod
    def open(cls, path: str | Path):
        """From a stored file, memory-mapped and checked against its length: ``(file, info)``."""
        try:
            file = ContainerFile(path, cls.magic, cls.versions)
            return file, cls(file.header, file.index)
        except PackFormatError as e:
            raise PackFormatError(f"{Path(path).name}: {e}") from None

    @property
    def num_shards(self) -> int:
        return len(self.shards)
