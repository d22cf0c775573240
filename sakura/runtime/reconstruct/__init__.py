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

import numpy as np
import torch

from sakura.formats.bitplanes import QuantizedFactors
from sakura.formats.pack import Geometry, PackReader, PackSource, write_pack
from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.reconstruct.base import Reconstructor
from sakura.runtime.reconstruct.opencl import OpenCLReconstructor
from sakura.runtime.reconstruct.torch_backend import TorchReconstructor

RECONSTRUCTORS = ("torch", "opencl")
_default: Reconstructor | None = None
_default_report: dict | None = None
_lock = threading.Lock()


def get_reconstructor(name: str, **options) -> Reconstructor:
    """A reconstructor by name; ``opencl`` options: ``platform`` (name substring), ``matmul`` (torch|opencl).
    Raises BackendUnavailable (one line, what is missing) when the backend cannot run here."""
    if name == "torch":
        return TorchReconstructor()
    if name == "opencl":
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


def _probe_pack(folder: Path) -> PackReader:
    """A small real pack (one shard of 2 layers, n = 903, d = 256, rank 32) to time the backends on.
    Its factors are random codes: decoding costs the same whatever the values, and the device
    side has no offline compression to make real ones with."""
    geo = Geometry(num_steps=1, num_layers=2, heads=4, head_dim=64, n=903, shard_size=2, max_rank=32, rank=32, group=8)
    rng = np.random.default_rng(1)

    def factors() -> QuantizedFactors:
        codes = [rng.integers(0, 256, (geo.rank, length), dtype=np.uint8) for length in (geo.n, geo.d)]
        scales = [rng.random(geo.rank, dtype=np.float32) for _ in range(2)]
        zero = [rng.integers(0, 256, geo.rank, dtype=np.uint8) for _ in range(2)]
        return QuantizedFactors(codes[0], scales[0], zero[0], codes[1], scales[1], zero[1],
                                rng.standard_normal(geo.d).astype(np.float16))

    units = 2 * geo.shard_size  # K and V of each layer of the one shard
    source = PackSource(geo, [([factors() for _ in range(units)], [])], torch.arange(geo.n), "float32", {}, None)
    path = folder / "probe.pack"
    write_pack(path, source)
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


__all__ = ["BackendUnavailable", "RECONSTRUCTORS", "Reconstructor", "available_reconstructors",
           "default_reconstructor", "default_report", "get_reconstructor", "measure"]
