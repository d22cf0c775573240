"""From a catalog template (+ a request) to what the model runs, and the models a catalog needs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from sakura.model import DiTAdapter, EditRequest, load_model


@lru_cache(maxsize=4)
def _cached_model(name_or_path: str) -> DiTAdapter:
    return load_model(name_or_path)


def model_for(template, model_path: str | Path | None = None) -> DiTAdapter:
    """The model a template was made for (loaded once per process), or the one at ``model_path``."""
    return _cached_model(str(model_path) if model_path else template.model)


def edit_request(template, request=None, *, prompt: str | None = None, reference: np.ndarray | None = None,
                 resolution: int = 256, ref_size: int = 64) -> EditRequest:
    """An EditRequest for ``template`` from a catalog request or an explicit prompt / reference image."""
    if request is not None:
        prompt = request.prompt if request.prompt is not None else prompt
        if request.reference is not None:
            reference = request.reference_image(ref_size)
    return EditRequest(template.image(resolution), template.mask(resolution), template.task,
                       prompt=prompt or "", reference=reference, seed=template.seed)
