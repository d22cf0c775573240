"""Where a phone bundle is written (:mod:`sakura.runtime.bundle`): the folder checks, a staging folder beside it,
the switch-over, and the one-line error. Light (no torch), so ``sakura export --bundle`` refuses a bad folder
before it loads anything."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class BundleError(ValueError):
    """A bundle that cannot be written or read (bad folder, a model the bundle does not cover); one line."""


def prepare_folder(out: Path, force: bool) -> Path:
    """Check that ``out`` can become a bundle and return the staging folder beside it (written, then renamed by
    :func:`publish`): a file, a non-empty folder without ``force`` or a folder that cannot be written is a
    :class:`BundleError`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BundleError(f"--bundle {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise BundleError(f"--bundle {out} exists and is not empty: choose another folder or pass --force to "
                          "replace it")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise BundleError(f"cannot write the bundle to {out}: {parent} does not exist")
    stage = parent / f".{out.name}.partial-{os.getpid()}"
    try:
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir()
        (stage / ".probe").write_bytes(b"")
        (stage / ".probe").unlink()
    except OSError as e:
        raise BundleError(f"cannot write the bundle to {out}: {e.strerror or e} ({parent})") from None
    return stage


def publish(stage: Path, out: Path) -> None:
    """Put the finished staging folder at ``out`` (an older bundle there is moved aside first, then removed)."""
    out = Path(out)
    old = None
    if out.exists():
        old = out.absolute().parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(stage, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
