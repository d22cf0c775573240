"""Where things live by default: the one packs folder every command shares.

``edit``, ``build``, ``serve``, ``bench``, ``report``, ``demo`` and ``device`` all read and write the same
folder when ``--packs`` (``--out`` for ``build``) is not given, and say which on stderr: a bench run from
another working directory no longer builds ~200 MB of packs wherever it happens to be.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
PACKS_HELP = "default: $SAKURA_PACKS, else packs/ in the checkout, else ~/.cache/sakura/packs"


def cache_root() -> Path:
    """The user's SAKURA cache folder: ``$SAKURA_CACHE_DIR``, else ``$XDG_CACHE_HOME/sakura`` (``~/.cache``)."""
    if os.environ.get("SAKURA_CACHE_DIR"):
        return Path(os.environ["SAKURA_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sakura"


def default_packs() -> Path:
    """``$SAKURA_PACKS``; else ``packs/`` in the source checkout (an editable install, where ``make demo``
    and the tests keep theirs); else ``packs/`` in the user's cache folder. Never the working directory."""
    if os.environ.get("SAKURA_PACKS"):
        return Path(os.environ["SAKURA_PACKS"])
    if (CHECKOUT / "pyproject.toml").is_file() and os.access(CHECKOUT, os.W_OK):
        return CHECKOUT / "packs"
    return cache_root() / "packs"


def packs_or_default(value: str | Path | None) -> str:
    """``value``, or the default folder, announced on stderr (``packs: PATH (default)``)."""
    if value:
        return str(value)
    folder = default_packs()
    print(f"packs: {folder} (default)", file=sys.stderr, flush=True)
    return str(folder)
