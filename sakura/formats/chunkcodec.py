"""Lossless coding of one stored bit-plane chunk of a version-2 pack (zstd, or raw where it does not pay).

Measured on the fs-astronaut pack (rank 128, 8 planes; /tmp table in the issue-18 report): the
offset-binary planes below the sign are as good as incompressible (zstd 1.00×), because a small
negative value is ``0111…`` and a small positive one ``1000…``. Stored as *magnitude* planes —
plane p ≥ 1 XOR NOT(plane 0), i.e. the bits of ``|k − 128|``-ish (ones' complement for negatives) —
plane 1 codes to 0.46× and plane 2 to 0.92× of raw; lower planes stay raw. So:

* :func:`to_magnitude` / :func:`from_magnitude` — the per-plane XOR with the inverted sign plane (a
  client holding plane p always holds plane 0 of the same components: prefixes);
* :func:`encode` — zstd at :data:`LEVEL` when the frame is at most :data:`PAYS` of the raw bytes,
  else the raw bytes; a per-chunk flag in the header says which;
* :func:`decode` — the exact raw length back, or :class:`PackFormatError` for a frame that is not
  zstd, decodes to the wrong length, or claims more than the chunk's raw size (no unbounded output).

Each chunk is a complete zstd frame: independently decodable, CRC-checked (on the stored bytes) by
the container before it reaches here.
"""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from sakura.formats.container import PackFormatError

LEVEL = 12  # decode speed does not depend on the level; above ~12 the frames shrink < 0.5 % more
PAYS = 0.97  # keep raw unless coding saves at least 3 % (decoding a frame costs time)
_compressor = zstandard.ZstdCompressor(level=LEVEL, write_checksum=False, write_content_size=True,
                                       write_dict_id=False)


_local = threading.local()  # zstd contexts are not thread-safe; making one per chunk costs ~50 µs


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "d"):
        _local.d = zstandard.ZstdDecompressor()
    return _local.d


def to_magnitude(plane: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Packed bits of plane p ≥ 1 → magnitude form (same shape), given the packed sign plane 0."""
    return plane ^ ~sign


from_magnitude = to_magnitude  # an XOR is its own inverse


def encode(raw: bytes) -> tuple[bytes, bool]:
    """``(stored bytes, coded?)``: a zstd frame when it is at most ``PAYS`` of ``raw``, else ``raw``."""
    frame = _compressor.compress(raw)
    if len(frame) <= PAYS * len(raw):
        return frame, True
    return raw, False


def decode(stored: bytes, coded: bool, raw_length: int, what: str = "chunk") -> bytes:
    """The raw bytes of a stored chunk (``raw_length`` of them), or PackFormatError."""
    if not coded:
        if len(stored) != raw_length:
            raise PackFormatError(f"{what}: {len(stored)} raw bytes, expected {raw_length}")
        return stored
    try:
        params = zstandard.get_frame_parameters(stored)
        if params.content_size != raw_length:
            raise PackFormatError(f"{what}: coded frame holds {params.content_size} bytes, expected {raw_length}")
        out = _decompressor().decompress(stored, max_output_size=raw_length)
    except zstandard.ZstdError as e:
        raise PackFormatError(f"{what}: corrupt coded chunk ({e})") from None
    if len(out) != raw_length:
        raise PackFormatError(f"{what}: coded chunk decodes to {len(out)} bytes, expected {raw_length}")
    return out
