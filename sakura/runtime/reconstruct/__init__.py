"""Reconstruction backends: rebuild a shard's K/V from the received pack bytes.

>>> rec = get_reconstructor("opencl")      # "torch" | "opencl"; default_reconstructor() picks the fastest
>>> kv = rec.rebuild(info, shard, r, b_a, b_b, blobs)   # {(step, layer): (K, V)}, each (n, d) float32

See :mod:`sakura.runtime.reconstruct.base` and docs/device-backends.md.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.reconstruct.base import KVShard, Reconstructor, shard_bytes

RECONSTRUCTORS = ("torch", "opencl")
_default: Reconstructor | None = None
_default_report: dict | None = None
_lock = threading.Lock()


def get_reconstructor(name: str, **options) -> Reconstructor:
    """A reconstructor by name; ``opencl`` options: ``platform`` (name substring), ``matmul`` (torch|opencl).
    Raises BackendUnavailable (one line, what is missing) when the backend cannot run here."""
    if name == "torch":
        from sakura.runtime.reconstruct.torch_backend import TorchReconstructor

        return TorchReconstructor()
    if name == "opencl":
        from sakura.runtime.reconstruct.opencl import OpenCLReconstructor

        return OpenCLReconstructor(**options)
    raise ValueError(f"unknown reconstructor {name!r}; choose one of {', '.join(RECONSTRUCTORS)}")


def available_reconstructors() -> dict[str, str]:
    """name → "ok" or the reason it is unavailable."""
    out = {}
    for name in RECONSTRUCTORS:
        try:
            get_reconstructor(name).close()
            out[name] = "ok"
        except BackendUnavailable as e:
            out[name] = str(e)
    return out


def _probe_pack(folder: Path):
    """A small real pack (synthetic cache, one shard of 2 layers) to time the backends on."""
    from sakura.offline.pack import PackReader, write_pack
    from sakura.offline.synthetic import synthetic_cache

    cache, imp = synthetic_cache(num_steps=1, num_layers=2, grid=32, mask_box=11, seed=1)
    path = folder / "probe.pack"
    write_pack(path, cache.to(__import__("torch").float32), imp, max_rank=32, shard_size=2, tradeoff=False)
    return PackReader(path)


def measure(names=RECONSTRUCTORS, repeats: int = 5) -> dict[str, float | str]:
    """Best-of-``repeats`` seconds per backend on a probe shard (r=32, 4+4 bits); a string if unavailable."""
    with tempfile.TemporaryDirectory(prefix="sakura-rec-") as tmp:
        reader = _probe_pack(Path(tmp))
        blobs = reader.read(0, 32, 4, 4)
        out: dict[str, float | str] = {}
        for name in names:
            try:
                rec = get_reconstructor(name)
            except BackendUnavailable as e:
                out[name] = str(e)
                continue
            rec.rebuild(reader.info, 0, 32, 4, 4, blobs)  # warm-up (kernel build, first allocations)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                rec.rebuild(reader.info, 0, 32, 4, 4, blobs)
                best = min(best, time.perf_counter() - t0)
            out[name] = best
    return out


def default_reconstructor() -> Reconstructor:
    """The fastest available backend, measured once per process (``$SAKURA_RECONSTRUCTOR`` forces one);
    torch when OpenCL is missing."""
    global _default, _default_report
    with _lock:
        if _default is not None:
            return _default
        forced = os.environ.get("SAKURA_RECONSTRUCTOR")
        if forced:
            _default = get_reconstructor(forced)
            _default_report = {"chosen": forced, "forced": True}
            return _default
        times = measure()
        usable = {k: v for k, v in times.items() if isinstance(v, float)}
        name = min(usable, key=usable.get) if usable else "torch"
        _default = get_reconstructor(name)
        _default_report = {"chosen": name, "seconds": times}
        return _default


def default_report() -> dict | None:
    """How the default was chosen (after :func:`default_reconstructor`)."""
    return _default_report


__all__ = ["BackendUnavailable", "KVShard", "RECONSTRUCTORS", "Reconstructor", "available_reconstructors",
           "default_reconstructor", "default_report", "get_reconstructor", "measure", "shard_bytes"]
