"""Quality explorer: image quality against the bytes a system sends (the paper's Fig. 15 frontier).

For one template and one of its catalog requests, every point is a real masked edit whose
reusable K/V were rebuilt from exactly the bytes a given configuration would transfer:

* SAKURA — a total byte budget split evenly over the shards; each shard takes the best profiled
  (rank, bits_A, bits_B) of its pack's frontier that fits (the allocator's rule, without a link);
* IntQ — one bit width for the whole edit (each stored width is a point);
* CacheGen — one stored quality level for every shard (each level is a point), its tables included.

Quality is PSNR / SSIM against the output on the exact FP16 cache (the reference). This reads the
template's pack files straight from the pack store — a folder, or ``s3://bucket/prefix`` through
presigned ranges (template data, read-only; nothing about a user's edit is involved) — decoding them
with the same stream encodings the device runtime uses. Frontiers are cached as JSON + PNGs under
``cache_dir`` keyed by each pack file's version in the store (size + mtime of a file, hash of an object).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image

from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.formats import encoding_from_header, file_id
from sakura.net.refs import resolving
from sakura.net.stores import Store, open_store
from sakura.online.policies import best_within
from sakura.quality import quality
from sakura.runtime.compute import zero_cache
from sakura.systems import COMPRESSED, COMPRESSED_BASELINES, SYSTEMS

FORMATS = ("fp16",) + tuple(SYSTEMS[name].format for name in COMPRESSED)



@dataclass
class Point:
    system: str
    bytes: int
    config: str
    psnr: float
    ssim: float
    psnr_masked: float
    ssim_masked: float
    image: str  # PNG file name inside the frontier's folder


class Explorer:
    def __init__(self, packs: Store | str | Path, cache_dir: str | Path, catalog=None, budgets: int = 9,
                 baseline_levels: int | None = None):
        """``packs``: the pack store (a :class:`~sakura.net.stores.Store`, a folder or an ``s3://`` URL);
        ``budgets``: SAKURA budget points (log-spaced); ``baseline_levels``: at most this many IntQ
        widths / CacheGen levels (evenly spaced, smallest first; None = all)."""
        self.packs = packs
        self._store = packs if isinstance(packs, Store) else None
        self.cache = Path(cache_dir)
        self.catalog_path = catalog
        self.budgets = max(1, int(budgets))
        self.baseline_levels = baseline_levels
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------------
    def catalog(self):
        return load_catalog(self.catalog_path)

    @property
    def store(self) -> Store:
        """The pack store, opened at first use (a folder that does not exist yet is an error then)."""
        if self._store is None:
            self._store = open_store(self.packs)
        return self._store

    def available(self) -> list[str]:
        """Templates whose four stored formats are all published in the pack store."""
        published = self.store.templates()
        return [t.id for t in self.catalog()
                if all(file_id(t.id, fmt) in published.get(t.id, {}).get("files", {}) for fmt in FORMATS)]

    def requests(self, template_id: str) -> list[str]:
        """Labels of the template's evaluation requests (the explorer's choices)."""
        return [str(r.label) for r in self.catalog().get(template_id).eval_requests]

    def _key(self, template_id: str, request: int) -> str:
        h = hashlib.sha256(f"{template_id}|{request}|{self.budgets}|{self.baseline_levels}|zeroed".encode())
        for fmt in FORMATS:
            fid = file_id(template_id, fmt)
            h.update(f"{fid}:{self.store.version(fid)}".encode())
        return h.hexdigest()[:16]

    def folder(self, template_id: str, request: int) -> Path:
        return self.cache / f"{template_id}-{request}-{self._key(template_id, request)}"

    def folder_of(self, data: dict) -> Path:
        """The folder a frontier's images are in: the one it was computed in (a build publishing meanwhile changes
        the packs' versions, so :meth:`folder`'s key)."""
        if "folder" in data:
            return self.cache / data["folder"]
        return self.folder(data["template_id"], data["request"])

    def cached(self, template_id: str, request: int) -> dict | None:
        f = self.folder(template_id, request) / "frontier.json"
        if f.is_file():
            return json.loads(f.read_text())
        return None

    # ---------------------------------------------------------------------------------------------
    def frontier(self, template_id: str, request: int, progress: Callable[[float, str], None] | None = None) -> dict:
        """``{"template_id", "request", "fp16_bytes", "reference": png name, "mask": png name, "zeroed": {image:
        png name, psnr, ssim, psnr_masked, ssim_masked} (the edit on a cache of zeros), "points": [Point...]}``,
        computed once and cached on disk."""
        have = self.cached(template_id, request)
        if have:
            return have
        with self._lock:  # one computation at a time (2 cores); a second caller finds it cached
            have = self.cached(template_id, request)
            if have:
                return have
            return self._compute(template_id, request, progress or (lambda f, m: None))

    def _compute(self, template_id: str, request: int, say: Callable[[float, str], None]) -> dict:
        with self.store.source() as source:  # opened per frontier: a rebuilt pack is read afresh
            return self._compute_from(source, template_id, request, say)

    def _compute_from(self, source, template_id: str, request: int,
                      say: Callable[[float, str], None]) -> dict:
        say(0.0, "loading the model and the template")
        tpl = self.catalog().get(template_id)
        reqs = tpl.eval_requests
        if not 0 <= request < len(reqs):
            raise ValueError(f"{template_id} has {len(reqs)} evaluation requests; no request #{request}")
        model = model_for(tpl)
        req = edit_request(tpl, reqs[request], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
        out = self.folder(template_id, request)
        out.mkdir(parents=True, exist_ok=True)

        encs = {fmt: encoding_from_header(fmt, source.header_bytes(file_id(template_id, fmt))) for fmt in FORMATS}

        def run(name: str, choose: Callable) -> tuple[np.ndarray, int, list[str]]:
            enc, fid = encs[name].fresh(), file_id(template_id, name)
            nbytes = 0
            kv, labels = {}, []
            for u in enc.units:
                lv = choose(enc.priced(u))  # side data (CacheGen's tables) counted where first fetched
                rs = enc.ranges(u, lv)
                kv.update(enc.decode(u, lv, resolving(source, fid, enc).fetch(fid, rs)))  # (the ladder's top: FP16's)
                nbytes += sum(n for _, n in rs)
                labels.append(lv.label)
            res = model.masked_edit(req, lambda s, l: tuple(t.to(torch.float32) for t in kv[(s, l)]))
            return res.image, nbytes, labels

        plans: list[tuple[str, Callable]] = []
        sak_units = encs["sakura"].units
        lo = sum(min(lv.nbytes for lv in u.levels) for u in sak_units)
        hi = sum(max(lv.nbytes for lv in u.levels if not lv.rung) for u in sak_units)
        top = sum(max(lv.nbytes for lv in u.levels) for u in sak_units)  # the ladder's top: the FP16 values
        seen = set()
        budgets = list(np.geomspace(max(lo, 1), hi, self.budgets) if self.budgets > 1 else [hi])
        if top > hi:  # the curve continues up the ladder (rungs above the allocated levels) to the top
            budgets += list(np.geomspace(hi, top, max(3, self.budgets // 2) + 1)[1:])
        for b in budgets:
            per = b / len(sak_units)
            pick = tuple(best_within(u.levels, per)[0].label for u in sak_units)
            if pick not in seen:
                seen.add(pick)
                plans.append(("sakura", lambda u, per=per: best_within(u.levels, per)[0]))
        for name in COMPRESSED_BASELINES:
            units = encs[name].units
            labels = sorted({lv.label for u in units for lv in u.levels},
                            key=lambda lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab))
            for lab in _spread(labels, self.baseline_levels):
                plans.append((name, lambda u, lab=lab: next(lv for lv in u.levels if lv.label == lab)))

        total = len(plans) + 1
        say(0.02, f"reference: masked edit on the exact FP16 cache (1/{total})")
        ref, fp16_bytes, _ = run("fp16", lambda u: u.levels[0])
        Image.fromarray(_u8(ref)).save(out / "reference.png")
        Image.fromarray((req.mask * 255).astype(np.uint8)).save(out / "mask.png")
        # a cache of zeros: the edit with nothing streamed (a study's control that must look different)
        zeroed = model.masked_edit(req, zero_cache(model, req).provider()).image
        Image.fromarray(_u8(zeroed)).save(out / "zeroed.png")
        points = []
        for i, (name, choose) in enumerate(plans, start=2):
            say((i - 1) / total, f"{name}: rebuilding the cache from its bytes and editing ({i}/{total})")
            img, nbytes, labels = run(name, choose)
            q = quality(img, ref, req.mask)
            fname = f"{name}-{i:02d}.png"
            Image.fromarray(_u8(img)).save(out / fname)
            points.append(Point(name, int(nbytes), _summarise(labels), q["psnr"], q["ssim"], q["psnr_masked"],
                                q["ssim_masked"], fname))
        data = {"template_id": template_id, "request": request, "request_label": str(reqs[request].label),
                "folder": out.name,  # (the packs' versions can change while it runs: the key then names another)
                "fp16_bytes": int(fp16_bytes), "reference": "reference.png", "mask": "mask.png",
                "zeroed": {"image": "zeroed.png", **quality(zeroed, ref, req.mask)},
                "points": [asdict(p) for p in sorted(points, key=lambda p: (p.system, p.bytes))]}
        (out / "frontier.json").write_text(json.dumps(data, indent=1))
        say(1.0, "done")
        return data

    # ---------------------------------------------------------------------------------------------


def _spread(items: list, k: int | None) -> list:
    """At most ``k`` of ``items``, evenly spaced, the first always included."""
    if k is None or k >= len(items):
        return list(items)
    if k <= 1:
        return items[:1]
    idx = sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})
    return [items[i] for i in idx]


def _summarise(labels: list[str]) -> str:
    """'int4' when every unit used the same level, else the distinct levels with counts."""
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    if len(counts) == 1:
        return labels[0]
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:4]) + (
        "…" if len(counts) > 4 else "")


def _u8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)
