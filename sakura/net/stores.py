"""Pack stores by URL: where built packs are published and read — a local folder or an S3 bucket.

``open_store("packs")`` or ``open_store("s3://bucket/prefix")`` gives a :class:`Store`; every path that
writes or reads packs (build, serve, the device runtime, the load test) takes either. One plug-in per
backend, picked by the URL's scheme (:data:`BACKENDS`):

* :class:`FolderStore` — the embedded default, exactly the layout the template server always served:
  ``<root>/<file id>.pack`` plus ``<id>.build.json``.
* :class:`sakura.net.s3store.S3Store` — content-addressed immutable objects and one small index object
  per template, written last (:mod:`sakura.net.s3store`).

Both publish the same way: a build writes every file into a staging folder, then :meth:`Store.publish`
makes the whole template visible at once; a reader never sees half a template, and a rebuild never
changes bytes under a reader that already resolved a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from sakura.formats import FORMATS, file_id
from sakura.net.client import FetchError
from sakura.net.s3store import S3Store  # (boto3 itself is imported only when an s3:// URL is used)
from sakura.net.store_base import (  # noqa: F401 - the interface is part of this module's public face
    MAIN_FORMAT,
    TEMPLATE_ID,
    Store,
    StoreError,
    build_key,
    check_template_id,
    is_store_url,
    staged_files,
    template_of,
)


class FolderStore(Store):
    """``<root>/<file id>.pack``: the embedded default and what ``sakura serve`` always served."""

    def __init__(self, root: str | Path, *, create: bool = False) -> None:
        self.root = Path(root)
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise StoreError(f"pack folder {self.root} does not exist (run `sakura build --out {self.root}`)")
        self.url = str(self.root)

    def _path(self, fid: str) -> Path:
        if not TEMPLATE_ID.match(fid) or ".." in fid:
            raise FetchError(400, f"bad file id {fid!r}")
        return self.root / f"{fid}.pack"

    def read(self, fid: str, offset: int, length: int) -> bytes:
        try:
            with open(self._path(fid), "rb") as f:
                data = os.pread(f.fileno(), length, offset)
        except FileNotFoundError:
            raise FetchError(404, f"no stored file {fid!r} in {self.root}") from None
        if len(data) != length:
            raise FetchError(416, f"{fid}: range {offset}+{length} is outside the file")
        return data

    def size(self, fid: str) -> int:
        try:
            return self._path(fid).stat().st_size
        except FileNotFoundError:
            raise FetchError(404, f"no stored file {fid!r} in {self.root}") from None

    def has_template(self, template_id: str) -> bool:
        return all((self.root / f"{file_id(template_id, n)}.pack").is_file() for n in FORMATS)

    def version(self, fid: str) -> str:
        try:
            st = self._path(fid).stat()
        except FileNotFoundError:
            raise FetchError(404, f"no stored file {fid!r} in {self.root}") from None
        return f"{st.st_size}:{st.st_mtime_ns}"

    def templates(self) -> dict[str, dict]:
        out: dict[str, dict] = {}
        for p in sorted(self.root.glob("*.pack")):
            tid = template_of(p.stem)
            out.setdefault(tid, {"build_key": None, "files": {}})["files"][p.stem] = p.stat().st_size
        for tid, info in out.items():
            info["build_key"] = self.published_key(tid)
        return {t: i for t, i in out.items() if file_id(t, MAIN_FORMAT) in i["files"]}

    def published_key(self, template_id: str) -> str | None:
        record = self.root / f"{check_template_id(template_id)}.build.json"
        if not self.has_template(template_id):
            return None
        try:
            return json.loads(record.read_text()).get("build_key")
        except (FileNotFoundError, ValueError):
            return None

    def publish(self, template_id: str, staged: Path, key: str) -> None:
        """Rename the staged files in (same file system: atomic each), the main pack last, then the record
        that names the build key: a half-published template has no key, so it is rebuilt, never skipped."""
        check_template_id(template_id)
        files = staged_files(template_id, staged)
        record_name = f"{template_id}.build.json"
        (self.root / record_name).unlink(missing_ok=True)
        for path in files:
            if path.name != record_name:
                os.replace(path, self.root / path.name)
        record = json.loads((staged / record_name).read_text()) if (staged / record_name).is_file() else {}
        tmp = self.root / f".{record_name}.tmp"
        tmp.write_text(json.dumps({**record, "build_key": key}, indent=1))
        os.replace(tmp, self.root / record_name)

    def source(self):
        from sakura.net.folder import FolderSource  # only a folder store reads through it (stores.py stays light)

        return FolderSource(self.root)


def _open_folder(url: str, **kw) -> Store:
    path = url[len("file://"):] if url.startswith("file://") else url
    return FolderStore(path, create=kw.get("create", False))


def _open_s3(url: str, **kw) -> Store:
    return S3Store.from_url(url, **kw)


BACKENDS = {"file": _open_folder, "s3": _open_s3}


def open_store(spec: str | os.PathLike, *, create: bool = False, endpoint_url: str | None = None) -> Store:
    """The store at a local path, ``file://PATH`` or ``s3://bucket/prefix`` (endpoint and credentials from
    ``endpoint_url`` or the AWS environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...). ``create``: make
    the folder / bucket when missing (writers)."""
    text = str(spec)
    scheme = urlsplit(text).scheme if is_store_url(text) else "file"
    if scheme not in BACKENDS:
        raise StoreError(f"unknown pack store {text!r}: use a folder path or {', '.join(s + '://' for s in BACKENDS)}")
    kw = {"create": create} if scheme == "file" else {"create": create, "endpoint_url": endpoint_url}
    return BACKENDS[scheme](text, **kw)
