"""What the agent answers when an edit does not happen, as exceptions the bridges re-raise."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class EditRejected(ValueError):
    """The job cannot run as given (bad photo, empty prompt, unknown template/system, bad trace…).
    ``str(e)`` is one friendly line."""

    code = "rejected"


class EditFailed(RuntimeError):
    """The job was valid but the edit failed (template server unreachable, packs missing, stream timed
    out, client cancelled…). ``str(e)`` is one line; ``code`` says which kind."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


def one_line(text: object, limit: int = 400) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def jsonable(obj: Any) -> Any:
    """Plain JSON types only: numpy → Python, tuples → lists, non-finite floats → None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
