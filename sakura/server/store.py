"""Where the template server's files are: ``<root>/<file_id>.pack``, and what identifies a version of one.

A *file id* names one stored file: a template's SAKURA pack (``<template>``) or one of its
baseline encodings (``<template>.fp16``, ``<template>.intq``, ...). Ids are plain names, so no
path can escape the root.
"""

from __future__ import annotations

import email.utils
import os
import re
from pathlib import Path

from fastapi.responses import JSONResponse

PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # a file id, or a trace file's name


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


class PackStore:
    """Maps file ids to ``<root>/<id>.pack``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"packs directory {self.root} does not exist")

    def path(self, file_id: str) -> Path | JSONResponse:
        """The file's path, or the error response that says why there is none."""
        if not PLAIN_NAME.match(file_id) or ".." in file_id:
            return error_response(400, f"invalid template id {file_id[:80]!r}: use letters, digits, '.', '_', '-'")
        p = self.root / f"{file_id}.pack"
        if not p.is_file():
            return error_response(404, f"unknown template {file_id!r}: no pack for it on this server")
        return p

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("*.pack") if p.is_file() and PLAIN_NAME.match(p.stem))


def etag(stat: os.stat_result) -> str:
    return f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'


def file_headers(stat: os.stat_result) -> dict[str, str]:
    return {
        "accept-ranges": "bytes",
        "etag": etag(stat),
        "last-modified": email.utils.formatdate(stat.st_mtime, usegmt=True),
    }
