"""The anytime order of a SAKURA pack level's bytes on the wire.

A pack stores every ``(r, b_A, b_B)`` as a set of chunks (rank groups × bit planes of A and B). A
configuration's chunks contain another's when its rank and both bit widths are at least as large, so
a chain of nested frontier configurations ending at the requested one can be sent smallest first:
every chain point is then a prefix of the request, and a runtime that must consume the shard early
decodes the largest point that arrived.
"""

from __future__ import annotations

from itertools import accumulate

from sakura.formats.base import Range
from sakura.formats.container import coalesce


def _inside(a: tuple, b: tuple) -> bool:
    return all(x <= y for x, y in zip(a, b))


def nested_chain(info, shard: int, key: tuple) -> tuple[list[tuple], list[list[Range]]]:
    """The longest chain of frontier configurations nested inside ``key`` (most prefixes = finest
    anytime steps), smallest first and ending at ``key``, and for each the byte ranges it adds. A level
    whose bytes are another file's (the ladder's exact rung) is a chain of its own."""
    if info.is_reference(shard, key):
        return [key], [info.ranges(shard, *key)]
    inside = sorted({c.key for c in info.frontier(shard)
                     if c.key != key and _inside(c.key, key) and not info.is_reference(shard, c.key)} | {key},
                    key=lambda k: info.config_bytes(shard, *k))
    best: dict[tuple, list[tuple]] = {}  # longest chain ending at each point, by size order (a DP)
    for k in inside:
        best[k] = max((best[j] for j in best if _inside(j, k)), key=len, default=[]) + [k]
    chain, segments, have = best[key], [], set()
    for k in chain:
        chunks = set(info.chunks(shard, *k))
        segments.append(coalesce([info.index.span(i) for i in sorted(chunks - have)]))
        have = chunks
    return chain, segments


def prefixes(levels: dict, level, chain: list[tuple], segments: list[list[Range]]) -> list[tuple]:
    """``(level, leading ranges)`` for each chain point the stream offers (``levels``, by key),
    smallest first, ending at ``level`` with all the ranges."""
    ends = list(accumulate(len(seg) for seg in segments))
    return [(levels[k], n) for k, n in zip(chain[:-1], ends) if k in levels] + [(level, ends[-1])]
