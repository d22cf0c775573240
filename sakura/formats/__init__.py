"""The stored formats, one module per format, and their registry.

- :mod:`container` the shared file framing: JSON header, chunk index, CRC32s, memory-mapped reads
- :mod:`bitplanes` bit-plane scalar quantisation of factor components (part of the pack format)
- :mod:`pack`      SAKURA's progressive pack: layout, writer, reader, decoder, stream encoding (v1 layout)
- :mod:`allocated` pack version 2: per-group bit allocation, entropy-coded planes (:mod:`chunkcodec`)
- :mod:`ladder`    pack version 3: version 2 plus rungs above the allocated levels up to the FP16 values
- :mod:`fp16`      the uncompressed FP16 cache (baseline and reference)
- :mod:`intq`      IntQ baseline (uniform integer quantisation, 2/3/4/8 bits)
- :mod:`cachegen`  CacheGen baseline (per-token quantisation, layer-group bins, entropy coding, levels)

:data:`FORMATS` is the one list of formats: everything that needs a format's suffix, header type,
writer or stream encoding reads it. Nothing here imports :mod:`sakura.offline` (the device decodes
with these modules); the offline side computes what the pack stores and calls its writer.
"""

from __future__ import annotations

from sakura.formats import allocated, cachegen, fp16, intq, ladder, pack  # noqa: F401 - allocated, ladder register pack v2, v3
from sakura.formats.base import KV, FetchUnit, Format, Level, Range, ShardEncoding, StreamEncoding
from sakura.formats.container import ChunkChecksumError, PackFormatError

FORMATS: dict[str, Format] = {fmt.name: fmt for fmt in (
    Format("sakura", pack.SUFFIX, pack.PackInfo, pack.PackEncoding, pack.write_pack, from_factors=True),
    # the version-1 pack (uniform bits, raw planes) beside the v2 one: the before of issue #18's comparisons
    Format("sakura-v1", ".v1", pack.PackInfo, pack.PackV1Encoding, pack.write_pack, from_factors=True,
           layout="uniform"),
    Format("fp16", fp16.SUFFIX, fp16.Fp16Info, fp16.Fp16Encoding, fp16.write_fp16),
    Format("intq", intq.SUFFIX, intq.IntQInfo, intq.IntQEncoding, intq.write_intq),
    Format("cachegen", cachegen.SUFFIX, cachegen.CacheGenInfo, cachegen.CacheGenEncoding, cachegen.write_cachegen),
)}


def get_format(name: str) -> Format:
    if name not in FORMATS:
        raise KeyError(f"unknown format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]


def file_id(template_id: str, format_name: str) -> str:
    """The id a server knows a stored file by (``<file_id>.pack`` on disk)."""
    return get_format(format_name).file_id(template_id)


def encoding_from_header(name: str, header: bytes) -> StreamEncoding:
    """Build the named format's stream encoding from the raw header bytes (``8 + N``) of its stored file."""
    return get_format(name).encoding_cls.from_header(header)  # type: ignore[attr-defined]


__all__ = ["FORMATS", "Format", "get_format", "file_id", "encoding_from_header", "Level", "FetchUnit",
           "StreamEncoding", "ShardEncoding", "KV", "Range", "PackFormatError", "ChunkChecksumError"]
