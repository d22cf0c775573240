"""CacheGen's codec: per-token quantisation, per-(layer, kind, channel) symbol tables, entropy coding.

The numeric half of :mod:`sakura.formats.cachegen` (that module is the file format and the stream).

- **Quantiser** (LMCache's ``torch_quant``): each token row gets a max-abs scale (stored as f2) and
  symmetric codes in ``[-c, c]``, ``c = bins // 2 − 1``; stored as symbols ``code + c`` in ``[0, 2c]``.
- **Tables**: one symbol distribution per (layer, kind, channel), estimated from the whole cache
  (all steps, all tokens), stored as integer frequencies summing to ≈ ``TABLE_TOTAL``. A group
  (layer, kind) stores only its own ``2c + 1`` symbols. 10-bit totals cost < 0.1% in coded bytes
  against 16-bit ones (measured on fs-astronaut) and make the lzma-compressed table ~2× smaller.
- **Coder**: constriction's ANS (``stream.stack.AnsCoder``) over each token chunk, channel after
  channel with that channel's categorical model (CacheGen uses an arithmetic coder; any coder that
  reaches the entropy of the same model gives the same bytes within a few words per chunk).

Why decode is a per-channel loop and not one batched call (measured on this machine, 1 thread, one
shard = 4 units × 4 chunks × 256 tokens × 256 channels ≈ 1M symbols): with the models built once per
level and reused, per-channel ``decode(model, 256)`` costs 17 / 25 / 35 ms for alphabets 3 / 15 / 63
(ANS; the range coder 22 / 30 / 38 ms). constriction's batched model-family API (one ``Categorical``
family, an (m, n) probability array per symbol, one call per chunk) is *slower*: 48 / 91 / 255 ms, as
it builds a model per symbol. A lock-step rANS decoder in numpy (one lane per (unit, channel), table
lookups by gather) measured ~50 ns per symbol, and its per-lane final states would add ~4 bytes per
lane. Coding k tokens as one symbol of a product model (k = 4 for ternary) made the coder calls
~1.5× faster but unpacking ate the gain (15.1 vs 15.5 ms per shard at the lowest level). So the
decoder loops over channels with prebuilt models: ~1 µs of Python per call, 1024 calls per chunk,
the rest is constriction's Rust at ~13–25 ns per symbol; dequantisation is vectorised (~3 ms per
shard). Result: 12–30 ms per shard against SAKURA's 2–11 ms at the same bytes (``python -m
sakura.eval.decode_cost``): 2.5–3× at L2–L5, 4.5–6× at L0–L1, where SAKURA's rebuild is a rank-8..48
matmul and CacheGen still decodes a symbol per value. CacheGen's authors decode on a GPU.
"""

from __future__ import annotations

import lzma
from typing import Any, Sequence

import constriction
import numpy as np

from sakura.formats.container import PackFormatError

TABLE_TOTAL = 1023  # frequencies of a channel sum to about this (10 bits)


def quantise(x: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-token max-abs quantisation of ``x`` (T, d): symbols in [0, 2c] (uint8) and f2 scales (T,)."""
    scales = np.abs(x).max(axis=1).astype(np.float16)
    m = np.where(scales > 0, scales.astype(np.float32), 1.0)  # all-zero rows stay zero whatever the scale
    q = np.clip(np.rint(x * (c / m[:, None])), -c, c) + c
    return q.astype(np.uint8), scales


def channel_counts(sym: np.ndarray, symbols: int) -> np.ndarray:
    """(d, symbols) histogram of each channel (column) of ``sym`` (T, d)."""
    d = sym.shape[1]
    flat = (np.arange(d) * symbols)[None, :] + sym
    return np.bincount(flat.ravel(), minlength=d * symbols).reshape(d, symbols)


def frequencies(counts: np.ndarray) -> np.ndarray:
    """Counts → u16 frequencies summing to about ``TABLE_TOTAL``; every seen symbol keeps ≥ 1, an unseen
    one 0 (the coder gives it its smallest probability, so it stays encodable)."""
    total = counts.sum(axis=-1, keepdims=True).clip(min=1)
    f = np.round(counts * (TABLE_TOTAL / total))
    return np.where(counts > 0, np.maximum(f, 1), 0).astype(np.uint16)


def pack_tables(freqs: Sequence[np.ndarray]) -> bytes:
    """A level's tables, group after group, as one lzma-compressed u16 array."""
    return lzma.compress(b"".join(f.astype("<u2").tobytes() for f in freqs))


def unpack_tables(data: bytes, shapes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    try:
        flat = np.frombuffer(lzma.decompress(data), dtype="<u2")
    except lzma.LZMAError as e:
        raise PackFormatError(f"CacheGen table does not decompress: {e}") from None
    sizes = [a * b for a, b in shapes]
    if len(flat) != sum(sizes):
        raise PackFormatError(f"CacheGen table holds {len(flat)} frequencies, expected {sum(sizes)}")
    return [part.reshape(shape) for part, shape in zip(np.split(flat, np.cumsum(sizes)[:-1]), shapes)]


def models(freqs: np.ndarray) -> list[Any]:
    """One coder model per channel of a (d, symbols) frequency table (~2 µs each)."""
    return [constriction.stream.model.Categorical(f.astype(np.float64), perfect=False) for f in freqs]


def encode_chunk(syms: Sequence[np.ndarray], scales: Sequence[np.ndarray], unit_models: Sequence[list]) -> bytes:
    """One token chunk of a shard: ``[f2 scales, unit after unit][ANS words u32]``. ANS is last in,
    first out, so channels are pushed in reverse and the decoder reads them in order."""
    enc = constriction.stream.stack.AnsCoder()
    for sym, ms in zip(reversed(syms), reversed(unit_models)):
        for ch in range(sym.shape[1] - 1, -1, -1):
            enc.encode_reverse(np.ascontiguousarray(sym[:, ch], dtype=np.int32), ms[ch])
    words = enc.get_compressed().astype("<u4").tobytes()
    return b"".join(s.astype("<f2").tobytes() for s in scales) + words


def decode_chunk(data: bytes, groups: Sequence[tuple[int, list]], outs: Sequence[np.ndarray]) -> None:
    """Fill ``outs`` (one (T, d) float32 view per unit) from one chunk; ``groups[u] = (c, models)``."""
    t = outs[0].shape[0]
    head = 2 * t * len(outs)
    if len(data) < head or (len(data) - head) % 4:
        raise PackFormatError(f"CacheGen chunk has a bad length ({len(data)} bytes)")
    scales = np.frombuffer(data, dtype="<f2", count=t * len(outs)).reshape(len(outs), t).astype(np.float32)
    dec = constriction.stream.stack.AnsCoder(np.frombuffer(data, dtype="<u4", offset=head).astype(np.uint32))
    for (c, ms), scale, out in zip(groups, scales, outs):
        x = np.array([dec.decode(m, t) for m in ms], dtype=np.float32)  # (d, T): channel-major, as coded
        x -= c
        x *= scale / c
        out[...] = x.T
