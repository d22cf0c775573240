"""Helpers for the study's tests: a small pool of pairs with known metrics, and a served app.

The synthetic pool's pictures are the packaged astronaut with noise whose strength follows the pair's masked
PSNR; each system's masked PSNR rises with its budget level, at a per-system offset, so a participant who
answers by PSNR separates the systems by construction (what the report must then show).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from app.study import Candidate, StudyStore

SYSTEMS = ("sakura", "intq", "cachegen")
BASE_DB = {"sakura": 33.0, "intq": 27.0, "cachegen": 23.0}  # masked PSNR at level 0; +6 dB per level
FRACTION = {"sakura": 0.02, "intq": 0.14, "cachegen": 0.05}  # bytes / FP16 at level 0; ×2 per level
FP16 = 29_300_000
UNITS = (("fs-a", 0), ("fs-a", 1), ("mb-b", 0))
LEVELS = 3


def _png(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def psnr_of(system: str, level: int) -> float:
    return BASE_DB[system] + 6.0 * level


def synthetic_pool(store: StudyStore, size: int = 96) -> list[Candidate]:
    from skimage import data

    base = np.asarray(Image.fromarray(data.astronaut()).resize((size, size)), np.float64)
    other = np.asarray(Image.fromarray(data.coffee()).resize((size, size)), np.float64)
    rng = np.random.default_rng(0)
    cands = []
    for t, r in UNITS:
        ref = np.roll(base, 7 * r + (13 if t != "fs-a" else 0), axis=1)
        reference = store.add_image(_png(ref))
        common = dict(workload=t.split("-")[0], template_id=t, request=r, fp16_bytes=FP16, reference=reference)
        for s in SYSTEMS:
            for k in range(LEVELS):
                db = psnr_of(s, k)
                noise = rng.normal(0, 255 / 10 ** (db / 20), ref.shape)
                image = store.add_image(_png(ref + noise))
                cands.append(Candidate(id=f"{t}#{r}:{s}:{k}", kind="test", system=s, budget=k,
                                       bytes=int(FP16 * FRACTION[s] * 2 ** k), config=f"L{k}", psnr=db + 8,
                                       psnr_masked=db, ssim=0.9, ssim_masked=0.8, image=image, **common))
        wrong = store.add_image(_png(other))
        for kind, image in (("identical", reference), ("wrong", wrong)):
            cands.append(Candidate(id=f"{t}#{r}:{kind}", kind=kind, system=kind, budget=-1, bytes=0, config=kind,
                                   psnr=None, psnr_masked=None, ssim=None, ssim_masked=None, image=image, **common))
    store.add_candidates(cands)
    return cands
