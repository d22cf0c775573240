"""What every pack store is: the :class:`Store` interface, its error and the template-id rules every
backend applies (:mod:`sakura.net.stores` picks a backend by URL; each backend imports only this)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path

from sakura.formats import FORMATS, file_id

MAIN_FORMAT = "sakura"  # its pack is published last: a template is visible once its main pack is
TEMPLATE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class StoreError(RuntimeError):
    """A store cannot be used as asked: bad URL, unknown bucket, no credentials, unreachable endpoint."""


def is_store_url(spec: str | os.PathLike) -> bool:
    """True for ``scheme://...`` (an object store), False for a local path."""
    return "://" in str(spec)


def template_of(fid: str) -> str:
    """The template id a file id belongs to (``fs-astronaut.fp16`` -> ``fs-astronaut``)."""
    for fmt in FORMATS.values():
        if fmt.suffix and fid.endswith(fmt.suffix):
            return fid[: -len(fmt.suffix)]
    return fid


def check_template_id(template_id: str) -> str:
    if not TEMPLATE_ID.match(template_id) or ".." in template_id:
        raise StoreError(f"invalid template id {template_id[:80]!r}: use letters, digits, '.', '_', '-'")
    return template_id


def build_key(template, model_id: str, settings: dict) -> str:
    """What a pack's bytes depend on: the model, the template's manifest entry, the build settings and each
    format's version. Two builds with the same key write the same packs, so a build whose key is
    published is skipped (a new format version rebuilds)."""
    entry = {
        "id": template.id,
        "task": template.task,
        "image": repr(template.image_spec),
        "mask": repr(template.mask_spec),
        "model": template.model,
        "seed": template.seed,
        "profile": repr(template.profile_requests),
    }
    text = json.dumps({"model": model_id, "entry": entry, "settings": settings,
                       "formats": {name: list(getattr(fmt.info_cls, "versions", ())) for name, fmt in FORMATS.items()}},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Store(ABC):
    """Where packs live. Readers use :meth:`read` (one byte range) or :meth:`source` (the device link);
    writers :meth:`publish` a staged template."""

    url: str

    @abstractmethod
    def read(self, fid: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of a published file; :class:`FetchError` 404 if there is none."""

    @abstractmethod
    def size(self, fid: str) -> int:
        """Bytes of a published file (FetchError 404 if there is none)."""

    @abstractmethod
    def templates(self) -> dict[str, dict]:
        """Every published template: ``{id: {"build_key", "files": {file id: size}}}``."""

    @abstractmethod
    def published_key(self, template_id: str) -> str | None:
        """The build key of the template's published packs, None when it has none."""

    @abstractmethod
    def publish(self, template_id: str, staged: Path, key: str) -> None:
        """Make the files built in ``staged`` (one template's) the template's published version."""

    @abstractmethod
    def source(self):
        """A device-side reader of this store (``header_bytes``, ``fetch_timed``: one request per range)."""

    @abstractmethod
    def has_template(self, template_id: str) -> bool:
        """Every stored format of the template is published (cheap: the UI asks often)."""

    @abstractmethod
    def version(self, fid: str) -> str:
        """A string that changes whenever a published file's bytes do (caches key on it)."""

    def has_build(self, template_id: str, key: str) -> bool:
        return self.published_key(template_id) == key

    def close(self) -> None:
        pass


def staged_files(template_id: str, staged: Path) -> list[Path]:
    """The files of a staged build, the main pack last; refuses a build that lacks one of the packs."""
    main = f"{file_id(template_id, MAIN_FORMAT)}.pack"
    missing = [
        f"{file_id(template_id, n)}.pack" for n in FORMATS if not (staged / f"{file_id(template_id, n)}.pack").is_file()
    ]
    if missing:
        raise StoreError(f"the build of {template_id} wrote no {', '.join(missing)}")
    return sorted((p for p in staged.iterdir() if p.is_file()), key=lambda p: (p.name == main, p.name))
