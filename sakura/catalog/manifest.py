"""The catalog manifest (TOML): templates, their masks and their profiling / evaluation requests.

Layout (see ``templates_catalog/catalog.toml`` for the embedded one)::

    [catalog]                      # optional
    name = "my-catalog"
    description = "..."

    [[templates]]
    id = "fs-astronaut"            # unique; letters, digits, '-', '_', '.'
    task = "fs"                    # fs (face swap) | vton (virtual try-on) | mb (text edit)
    title = "Astronaut portrait"   # optional
    image = "skimage:astronaut"    # or a file path relative to this manifest (see images.py)
    crop = [0.15, 0.0, 0.75, 0.6]  # optional fractional box of the source, before the square crop
    mask = {ellipse = [0.47, 0.38, 0.17, 0.21]}   # or a PNG path / box / polygon (see masks.py)
    model = "sakura-tiny"          # optional; "sakura-tiny-sd3" for the mb-sd workload
    seed = 0                       # optional template noise seed
    profile = [...]                # exactly 5 requests used offline (token importance)
    eval = [...]                   # >= 5 other requests used to evaluate

A request is, for ``fs`` / ``vton``, a reference image spec (``"skimage:lfw_subset:17"`` or a table
``{ref, crop, flip, hue}``); for ``mb``, an instruction string (or ``{prompt = "..."}``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import sakura

from .errors import CatalogError, UnknownTemplateError
from .images import ImageSpec
from .masks import MaskSpec, token_mask

TASKS = ("fs", "vton", "mb")
TASK_NAMES = {"fs": "face swap", "vton": "virtual try-on", "mb": "text-instructed edit"}
DEFAULT_MODEL = "sakura-tiny"
NATIVE_RESOLUTION = 256
PATCH = 8
N_PROFILE = 5
MIN_EVAL = 5
DEFAULT_REFERENCE_SIZE = 64
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_TEMPLATE_KEYS = {"id", "task", "title", "image", "crop", "mask", "model", "seed", "profile", "eval"}


def default_catalog_path() -> Path:
    """The embedded manifest: ``templates_catalog/catalog.toml`` next to the ``sakura`` package."""
    return Path(sakura.__file__).resolve().parent.parent / "templates_catalog" / "catalog.toml"


@dataclass(frozen=True)
class Request:
    """One edit request of a template: a reference image (fs, vton) or an instruction (mb)."""

    task: str
    prompt: str | None = None
    reference: ImageSpec | None = None

    @property
    def key(self) -> str:
        """Canonical identity (used to keep profiling and evaluation sets disjoint)."""
        return f"prompt:{self.prompt.strip().lower()}" if self.prompt is not None else f"ref:{self.reference.key}"

    @property
    def label(self) -> str:
        return self.prompt if self.prompt is not None else self.reference.key

    @property
    def is_text(self) -> bool:
        return self.prompt is not None

    def reference_image(self, size: int = DEFAULT_REFERENCE_SIZE) -> np.ndarray:
        """The prepared reference: float32 ``(size, size, 3)`` in [0, 1]."""
        if self.reference is None:
            raise CatalogError(f"request '{self.label}' is a text instruction ({self.task}); it has no "
                               f"reference image")
        return self.reference.load(size)

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Template:
    """A template: image + editable mask + task, with its profiling and evaluation requests."""

    id: str
    task: str
    image_spec: ImageSpec
    mask_spec: MaskSpec
    model: str = DEFAULT_MODEL
    title: str = ""
    seed: int = 0
    profile_requests: tuple[Request, ...] = ()
    eval_requests: tuple[Request, ...] = ()
    base_dir: Path | None = field(default=None, compare=False)  # folder of the manifest

    # ---------------------------------------------------------------- pixels
    def image(self, resolution: int = NATIVE_RESOLUTION) -> np.ndarray:
        """float32 ``(resolution, resolution, 3)`` in [0, 1]."""
        return self.image_spec.load(resolution)

    def mask(self, resolution: int = NATIVE_RESOLUTION) -> np.ndarray:
        """bool ``(resolution, resolution)``; True = editable."""
        return self.mask_spec.render(resolution)

    @property
    def mask_ratio(self) -> float:
        """Fraction of pixels that are editable, at the native resolution."""
        return float(self.mask(NATIVE_RESOLUTION).mean())

    def token_mask(self, grid: int = NATIVE_RESOLUTION // PATCH, patch: int = PATCH) -> np.ndarray:
        """bool ``(grid*grid,)``, row-major; a token is editable if any pixel of its patch is.

        The pixel mask is rendered at ``grid * patch`` (256 for the default 32×32 grid of 8×8 patches).
        """
        return token_mask(self.mask(grid * patch), patch)

    @property
    def token_ratio(self) -> float:
        """Fraction of image tokens the device computes (masked tokens) on the native grid."""
        return float(self.token_mask().mean())

    def mask_bbox(self, resolution: int = NATIVE_RESOLUTION) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)`` pixel bounds (end-exclusive) of the editable region."""
        m = self.mask(resolution)
        rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
        return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1

    def reference_size(self, resolution: int = NATIVE_RESOLUTION, patch: int = PATCH) -> int:
        """Side of a reference that fills the mask: the mask's bounding box, rounded up to ``patch``."""
        x0, y0, x1, y1 = self.mask_bbox(resolution)
        side = max(x1 - x0, y1 - y0)
        return int(-(-side // patch) * patch)

    # ---------------------------------------------------------------- requests
    @property
    def requests(self) -> tuple[Request, ...]:
        return self.profile_requests + self.eval_requests

    def summary(self) -> dict[str, Any]:
        """A JSON-able description (for ``sakura catalog list --json``)."""
        return {
            "id": self.id, "task": self.task, "title": self.title, "model": self.model,
            "image": self.image_spec.key, "mask_ratio": round(self.mask_ratio, 4),
            "token_ratio": round(self.token_ratio, 4), "n_profile": len(self.profile_requests),
            "n_eval": len(self.eval_requests),
        }


@dataclass(frozen=True)
class Catalog:
    """An ordered set of templates loaded from one manifest."""

    templates: tuple[Template, ...]
    path: Path | None = None
    name: str = ""
    description: str = ""

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.templates]

    def get(self, template_id: str) -> Template:
        for t in self.templates:
            if t.id == template_id:
                return t
        raise UnknownTemplateError(f"unknown template '{template_id}'; valid ids: {', '.join(self.ids)}")

    __getitem__ = get

    def by_task(self, task: str) -> list[Template]:
        if task not in TASKS:
            raise CatalogError(f"unknown task '{task}'; expected one of {', '.join(TASKS)}")
        return [t for t in self.templates if t.task == task]

    def filter(self, task: str | None = None, model: str | None = None) -> list[Template]:
        out = list(self.templates) if task is None else self.by_task(task)
        return [t for t in out if model is None or t.model == model]

    def __iter__(self) -> Iterator[Template]:
        return iter(self.templates)

    def __len__(self) -> int:
        return len(self.templates)

    def __contains__(self, template_id: object) -> bool:
        return template_id in self.ids

    def validate(self) -> None:
        """Load every image and reference once (slower than ``load_catalog``'s checks)."""
        for t in self.templates:
            t.image()
            for r in t.requests:
                if r.reference is not None:
                    r.reference_image()


# -------------------------------------------------------------------- parsing
def _parse_request(value: Any, task: str, base_dir: Path, what: str) -> Request:
    if task == "mb":
        if isinstance(value, dict) and set(value) == {"prompt"}:
            value = value["prompt"]
        if not isinstance(value, str) or not value.strip():
            raise CatalogError(f"{what}: an mb request is a non-empty instruction string, got {value!r}")
        return Request(task=task, prompt=value.strip())
    if isinstance(value, dict) and "prompt" in value:
        raise CatalogError(f"{what}: a {task} request is a reference image, not a prompt")
    return Request(task=task, reference=ImageSpec.parse(value, base_dir, what=what))


def _parse_template(raw: Any, n: int, base_dir: Path, where: str) -> Template:
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: templates[{n}] must be a table")
    tid = raw.get("id")
    if not isinstance(tid, str) or not _ID.match(tid):
        raise CatalogError(f"{where}: templates[{n}] needs an id of letters, digits, '-', '_', '.' "
                           f"(got {tid!r})")
    what = f"{where}: template '{tid}'"
    unknown = set(raw) - _TEMPLATE_KEYS
    if unknown:
        raise CatalogError(f"{what}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_TEMPLATE_KEYS)}")
    task = raw.get("task")
    if task not in TASKS:
        raise CatalogError(f"{what}: invalid task {task!r}; expected one of {', '.join(TASKS)}")
    for key in ("image", "mask"):
        if key not in raw:
            raise CatalogError(f"{what}: missing '{key}'")
    image_value = raw["image"]
    if "crop" in raw:
        if isinstance(image_value, dict):
            raise CatalogError(f"{what}: give crop either at the template level or inside image, not both")
        image_value = {"ref": image_value, "crop": raw["crop"]}
    image = ImageSpec.parse(image_value, base_dir, what=f"{what}: image")
    mask = MaskSpec.parse(raw["mask"], base_dir, what=f"{what}: mask")
    model = raw.get("model", DEFAULT_MODEL)
    if not isinstance(model, str) or not model.strip():
        raise CatalogError(f"{what}: model must be a non-empty string such as '{DEFAULT_MODEL}'")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CatalogError(f"{what}: seed must be an integer, got {seed!r}")
    title = raw.get("title", "")
    if not isinstance(title, str):
        raise CatalogError(f"{what}: title must be a string")

    reqs: dict[str, tuple[Request, ...]] = {}
    for key in ("profile", "eval"):
        vals = raw.get(key, [])
        if not isinstance(vals, list):
            raise CatalogError(f"{what}: {key} must be a list of requests")
        reqs[key] = tuple(_parse_request(v, task, base_dir, f"{what}: {key}[{i}]") for i, v in enumerate(vals))
        keys = [r.key for r in reqs[key]]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise CatalogError(f"{what}: {key} lists the same request twice: {dup[0]}")
    if len(reqs["profile"]) != N_PROFILE:
        raise CatalogError(f"{what}: needs exactly {N_PROFILE} profiling requests, has {len(reqs['profile'])}")
    if len(reqs["eval"]) < MIN_EVAL:
        raise CatalogError(f"{what}: needs at least {MIN_EVAL} evaluation requests, has {len(reqs['eval'])}")
    shared = sorted({r.key for r in reqs["profile"]} & {r.key for r in reqs["eval"]})
    if shared:
        raise CatalogError(f"{what}: request {shared[0]} is in both profile and eval; the sets must be disjoint")

    m = mask.render(NATIVE_RESOLUTION)  # reads PNG masks: shape errors surface here
    if not m.any():
        raise CatalogError(f"{what}: the mask is empty at {NATIVE_RESOLUTION}x{NATIVE_RESOLUTION}; nothing to edit")
    if m.all():
        raise CatalogError(f"{what}: the mask covers the whole image; nothing is left to reuse")
    return Template(id=tid, task=task, image_spec=image, mask_spec=mask, model=model.strip(), title=title,
                    seed=seed, profile_requests=reqs["profile"], eval_requests=reqs["eval"],
                    base_dir=base_dir)


def parse_catalog(data: dict[str, Any], base_dir: str | os.PathLike = ".", where: str = "catalog") -> Catalog:
    """A catalog from an already-parsed TOML document; relative paths resolve against ``base_dir``."""
    base = Path(base_dir).resolve()
    unknown = set(data) - {"catalog", "templates"}
    if unknown:
        raise CatalogError(f"{where}: unknown top-level key(s) {sorted(unknown)}; expected [catalog] and "
                           f"[[templates]]")
    meta = data.get("catalog", {})
    if not isinstance(meta, dict):
        raise CatalogError(f"{where}: [catalog] must be a table")
    raw = data.get("templates")
    if not isinstance(raw, list) or not raw:
        raise CatalogError(f"{where}: no templates; add at least one [[templates]] table")
    templates = []
    seen: set[str] = set()
    for n, r in enumerate(raw):
        t = _parse_template(r, n, base, where)
        if t.id in seen:
            raise CatalogError(f"{where}: duplicate template id '{t.id}'")
        seen.add(t.id)
        templates.append(t)
    return Catalog(templates=tuple(templates), path=None, name=str(meta.get("name", "")),
                   description=str(meta.get("description", "")))


def load_catalog(path: str | os.PathLike | None = None) -> Catalog:
    """Load and check a manifest; ``None`` = the embedded catalog. Raises :class:`CatalogError`.

    Checks structure, tasks, ids, request counts, image names / files (headers only) and masks;
    image pixels are decoded lazily (``Catalog.validate()`` decodes everything).
    """
    p = Path(path).expanduser() if path is not None else default_catalog_path()
    if not p.is_file():
        hint = ("" if path is not None else
                "; the embedded catalog lives in the source tree: install with pip install -e . or pass --catalog PATH")
        raise CatalogError(f"catalog manifest not found: {p}{hint}")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{p.name}: not valid TOML: {e}")
    except (OSError, UnicodeDecodeError) as e:
        raise CatalogError(f"cannot read catalog manifest {p}: {e}")
    cat = parse_catalog(data, p.parent, where=p.name)
    return Catalog(templates=cat.templates, path=p.resolve(), name=cat.name or p.stem,
                   description=cat.description)
