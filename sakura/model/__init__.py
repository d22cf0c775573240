"""DiT adapters (one file per diffusers family), the embedded models and model loading."""

from sakura.model.base import DiTAdapter, EditRequest, EditResult, LocalSwitch, ModelInputError
from sakura.model.embedded import DEFAULT_MODEL, EMBEDDED, ModelLoadError, load_model, seeded_model

__all__ = ["DiTAdapter", "EditRequest", "EditResult", "LocalSwitch", "ModelInputError", "DEFAULT_MODEL", "EMBEDDED",
           "ModelLoadError", "load_model", "seeded_model"]
