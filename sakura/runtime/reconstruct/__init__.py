"""Reconstruction backends: rebuild a shard's K/V from the received pack bytes.

>>> rec = get_reconstructor("opencl")      # "torch" | "opencl"; default_reconstructor() picks the fastest
>>> kv = rec.rebuild(info, shard, r, b_a, b_b, blobs)   # {(step, layer): (K, V)}, each (n, d) float32

See :mod:`sakura.runtime.reconstruct.base` and docs/device-backends.md.
"""

from __future__ import annotations

import json
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


def measure(names=RECONSTRUCTORS, repeats: int = 7) -> dict[str, float | str]:
    """Best-of-``repeats`` seconds per backend on a probe shard (r=32, 4+4 bits), interleaved so that
    background load hits every backend alike; a string (the reason) for an unavailable one."""
    with tempfile.TemporaryDirectory(prefix="sakura-rec-") as tmp:
        reader = _probe_pack(Path(tmp))
        blobs = reader.read(0, 32, 4, 4)
        out: dict[str, float | str] = {}
        recs = {}
        for name in names:
            try:
                recs[name] = get_reconstructor(name)
            except BackendUnavailable as e:
                out[name] = str(e)
                continue
            recs[name].rebuild(reader.info, 0, 32, 4, 4, blobs)  # warm-up (kernel build, first allocations)
            out[name] = float("inf")
        for _ in range(repeats):
            for name, rec in recs.items():
                t0 = time.perf_counter()
                rec.rebuild(reader.info, 0, 32, 4, 4, blobs)
                out[name] = min(out[name], time.perf_counter() - t0)
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("SAKURA_CACHE_DIR") or Path.home() / ".cache" / "sakura")


def _choice_key() -> str:
    import platform

    import torch

    try:
        from importlib.metadata import version

        ocl = version("pyopencl")
    except Exception:  # noqa: BLE001 - not installed
        ocl = "none"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}|{os.cpu_count()}|torch {torch.__version__}|pyopencl {ocl}|" + os.environ.get("SAKURA_OPENCL_ICD", "")


def default_reconstructor() -> Reconstructor:
    """The fastest available backend (``$SAKURA_RECONSTRUCTOR`` forces one); torch when OpenCL is
    missing. Measured once per machine and software versions: the choice is kept in
    ``$SAKURA_CACHE_DIR/reconstructor.json`` (default ``~/.cache/sakura``) and reused by later processes."""
    global _default, _default_report
    with _lock:
        if _default is not None:
            return _default
        forced = os.environ.get("SAKURA_RECONSTRUCTOR")
        if forced:
            _default = get_reconstructor(forced)
            _default_report = {"chosen": forced, "forced": True}
            return _default
        path, key = cache_dir() / "reconstructor.json", _choice_key()
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        if saved.get("key") == key and saved.get("chosen") in RECONSTRUCTORS:
            try:
                _default = get_reconstructor(saved["chosen"])
                _default_report = {**saved, "cached": True}
                return _default
            except BackendUnavailable:
                pass  # the environment changed under the same key: measure again
        times = measure()
        usable = {k: v for k, v in times.items() if isinstance(v, float)}
        name = min(usable, key=usable.get) if usable else "torch"
        _default = get_reconstructor(name)
        _default_report = {"key": key, "chosen": name, "seconds": times}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(_default_report, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home only costs a re-measure next time
        _default_report["cached"] = False
        return _default


def default_report() -> dict | None:
    """How the default was chosen (after :func:`default_reconstructor`)."""
    return _default_report


__all__ = ["BackendUnavailable", "KVShard", "RECONSTRUCTORS", "Reconstructor", "available_reconstructors",
           "default_reconstructor", "default_report", "get_reconstructor", "measure", "shard_bytes"]
