"""How the ``sakura`` command fails: one line on stderr and exit status 2 for every expected error
(:func:`friendly`), never a traceback; and the reference-image check done before anything decodes it."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import typer


class UserError(Exception):
    """An error the user can fix; printed as one line."""


# A reference photo's side limit (the device agent's, device_bridge.media.MAX_PHOTO_SIDE): checked from
# the file's header before anything is decoded; PIL refuses larger pixel counts outright.
MAX_IMAGE_SIDE = 4096


# Expected errors of other modules, each named by the module that defines it. They are looked up among the
# modules already imported, never imported here: an exception's class is defined by the time it is raised, and
# importing these modules to classify one error (sakura.model: torch and diffusers; ray_build: Ray) would make a
# one-line refusal cost seconds. tests/test_cli_startup.py checks that every entry names its class's module.
EXPECTED_ELSEWHERE = (
    ("sakura.catalog.errors", "CatalogError"), ("sakura.model.base", "ModelInputError"),
    ("sakura.model.embedded", "ModelLoadError"), ("sakura.formats.container", "PackFormatError"),
    ("sakura.net.traces", "TraceError"), ("sakura.runtime.executors.errors", "BackendUnavailable"),
    ("sakura.runtime.errors", "StreamError"), ("sakura.runtime.errors", "TemplateUnavailable"),
    ("sakura.net.byteranges", "FetchError"), ("sakura.net.store_base", "StoreError"),
    ("sakura.net.seaweed", "StoreStartError"), ("sakura.offline.ray_build", "RayUnavailable"),
    ("sakura.runtime.executors.base", "ShardExecutionError"), ("sakura.runtime.bundle_folder", "BundleError"),
    ("sakura.net.kernel", "KernelLinkError"),
    ("httpx", "TransportError"), ("websockets.exceptions", "WebSocketException"),
    ("PIL.Image", "DecompressionBombError"),
)


def _expected_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [UserError, FileNotFoundError, PermissionError, IsADirectoryError,
                                          ConnectionError, TimeoutError, KeyError]
    for mod, name in EXPECTED_ELSEWHERE:
        cls = getattr(sys.modules.get(mod), name, None)  # module not imported: none of its errors was raised
        if cls is not None:
            errors.append(cls)
    return tuple(errors)


def _message(e: BaseException) -> str:
    """One line for an expected error; a network failure says which server it was talking to."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    line = str(msg).strip().splitlines()[0] if str(msg).strip() else type(e).__name__
    module = type(e).__module__.split(".")[0]
    if module in ("httpx", "httpcore", "websockets") or isinstance(e, (ConnectionError, TimeoutError)):
        try:
            where = f" at {e.request.url.scheme}://{e.request.url.netloc.decode()}"  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # httpx raises RuntimeError when no request is attached
            where = ""
        return f"the template server{where} is unreachable or dropped the connection ({type(e).__name__}: {line})"
    return line


def friendly(fn):
    """Turn expected errors into ``error: <one line>`` and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except Exception as e:  # noqa: BLE001 - filtered just below
            if isinstance(e, _expected_errors()):
                typer.echo(f"error: {_message(e)}", err=True)
                raise typer.Exit(2)
            raise

    return wrapper


def check_image_file(spec: str | None, what: str = "reference image") -> None:
    """Refuse an image file larger than :data:`MAX_IMAGE_SIDE` per side from its header alone (PIL reads
    the size lazily), before anything decodes it; package images (``skimage:…``) are known and small."""
    import warnings

    from PIL import Image

    path = Path(spec).expanduser() if spec else None
    if path is None or not path.is_file():
        return  # a package image, or a missing file the loader reports
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size is checked just below
            with Image.open(path) as im:
                w, h = im.size
    except Image.DecompressionBombError:
        raise UserError(f"{what} {spec} is too large (over {2 * MAX_IMAGE_SIDE ** 2 / 1e6:.0f} M pixels; the limit is "
                        f"{MAX_IMAGE_SIDE} px per side): use a smaller image") from None
    except Exception as e:  # noqa: BLE001 - PIL raises many types for files it cannot identify
        raise UserError(f"{what} {spec} is not an image we can read ({type(e).__name__})") from None
    if max(w, h) > MAX_IMAGE_SIDE:
        raise UserError(f"{what} {spec} is too large ({w}×{h} px; the limit is {MAX_IMAGE_SIDE} px per side): "
                        "use a smaller image")
