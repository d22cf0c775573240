"""Byte ranges of one stored file that are another's: a source that resolves them.

A pack's ladder (:mod:`sakura.formats.ladder`) ends in the FP16 values, which are not stored twice: the
pack's header names the FP16 file, and that rung's ranges sit at offsets ``base + o`` of the pack, ``o``
an offset in the FP16 file (:class:`~sakura.formats.base.FileRef`). :class:`ReferencedSource` wraps any
source (client, store reader, folder, paced link's inner side) and fetches such ranges from the file
they name, one request per file in request order, as one transfer.
"""

from __future__ import annotations

from collections.abc import Sequence

from sakura.formats.base import FileRef
from sakura.net.byteranges import Transfer


class ReferencedSource:
    """``inner`` with the ranges of ``file_id`` at or past a reference's base read from the file it names."""

    def __init__(self, inner, file_id: str, refs: Sequence[FileRef]) -> None:
        self.inner, self.file_id, self.refs = inner, file_id, list(refs)

    def __getattr__(self, name):  # everything else (header_bytes, events, close, ...) is the inner source's
        return getattr(self.inner, name)

    def _target(self, offset: int) -> tuple[str, int]:
        for ref in self.refs:
            if ref.base <= offset < ref.base + ref.size:
                return ref.file_id, ref.base
        return self.file_id, 0

    def _runs(self, ranges) -> list[tuple[str, list[tuple[int, int]]]]:
        """Consecutive ranges of one file, in request order, as offsets of that file."""
        runs: list[tuple[str, list[tuple[int, int]]]] = []
        for offset, length in ranges:
            target, base = self._target(int(offset))
            if not runs or runs[-1][0] != target:
                runs.append((target, []))
            runs[-1][1].append((int(offset) - base, int(length)))
        return runs

    def fetch_timed(self, file_id: str, ranges) -> Transfer:
        runs = self._runs(ranges) if file_id == self.file_id else []
        if len(runs) <= 1 and (not runs or runs[0][0] == file_id):
            return self.inner.fetch_timed(file_id, ranges)
        parts = [self.inner.fetch_timed(target, rs) for target, rs in runs]
        return Transfer([p for t in parts for p in t.parts], sum(t.nbytes for t in parts),
                        sum(t.wire_bytes for t in parts), parts[0].t_request, parts[0].t_first_byte,
                        parts[-1].t_last_byte)

    def fetch(self, file_id: str, ranges) -> list[bytes]:
        runs = self._runs(ranges) if file_id == self.file_id else []
        if len(runs) <= 1 and (not runs or runs[0][0] == file_id):
            return self.inner.fetch(file_id, ranges)
        return [part for target, rs in runs for part in self.inner.fetch(target, rs)]


def resolving(source, file_id: str, encoding) -> object:
    """``source`` able to fetch every range ``encoding``'s levels name (itself when they name no other file)."""
    refs = getattr(encoding, "references", None) or []
    return ReferencedSource(source, file_id, refs) if refs else source
