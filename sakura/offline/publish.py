"""Build a template into a pack store: skip it when its packs are already published, else build into a
staging folder and publish (write first, publish after — no reader ever sees half a template).

Used by ``sakura build --out s3://...`` and by every Ray task of ``sakura build --ray``
(:mod:`sakura.offline.ray_build`); a plain ``sakura build --out FOLDER`` keeps writing the folder directly.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sakura.net.stores import FolderStore, Store, build_key
from sakura.offline.builder import DEFAULT_BASIS, DEFAULT_MAX_RANK, DEFAULT_SHARD_SIZE, build_template


@dataclass(frozen=True)
class BuildSettings:
    """Everything besides the template that a pack's bytes depend on."""

    q: float = 0.5
    max_rank: int = DEFAULT_MAX_RANK
    shard_size: int = DEFAULT_SHARD_SIZE
    model_path: str | None = None
    basis: str = DEFAULT_BASIS
    rebuild_rank: int | None = None  # pack_options' cap on decoded rank
    output_weights: bool = True  # measure output weights (per shard, per level) into the header

    def builder_kw(self) -> dict:
        return {"q": self.q, "max_rank": self.max_rank, "shard_size": self.shard_size, "model_path": self.model_path,
                "basis": self.basis, "rebuild_rank": self.rebuild_rank, "output_weights": self.output_weights}

    def key(self, template) -> str:
        settings = asdict(self)
        if self.rebuild_rank is None:  # builds published before the cap existed keep their key
            del settings["rebuild_rank"]
        if self.output_weights:  # (the default: keys of builds published before the flag stay as they were)
            del settings["output_weights"]
        return build_key(template, str(self.model_path or template.model), settings)


@dataclass
class Published:
    template_id: str
    status: str  # built | skipped
    seconds: float
    build_key: str
    fp16_bytes: int = 0
    sakura_bytes: int = 0


def staging_dir(store: Store, template_id: str) -> Path:
    """A fresh folder to build into: inside a folder store (so publishing is a rename on the same file
    system), else a temporary folder."""
    if isinstance(store, FolderStore):
        root = store.root / ".staging"
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{template_id}-", dir=root))
    return Path(tempfile.mkdtemp(prefix=f"sakura-build-{template_id}-"))


def build_into_store(template, store: Store, settings: BuildSettings = BuildSettings(), *, force: bool = False,
                     build: Callable = build_template, progress: Callable[[str], None] | None = None) -> Published:
    """Build ``template`` and publish it in ``store``, unless packs of the same build key are published."""
    t0 = time.perf_counter()
    key = settings.key(template)
    if not force and store.has_build(template.id, key):
        return Published(template.id, "skipped", time.perf_counter() - t0, key)
    staged = staging_dir(store, template.id)
    try:
        report = build(template, staged, progress=progress, **settings.builder_kw())
        if progress:
            progress("publishing")
        store.publish(template.id, staged, key)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    storage = getattr(report, "storage", {}) or {}
    return Published(template.id, "built", time.perf_counter() - t0, key, getattr(report, "fp16_bytes", 0),
                     storage.get("sakura", 0))
