"""OpenCL reconstruction (pyopencl; here the PoCL CPU device, on a phone its GPU).

Kernels unpack the received bit planes and dequantise A and B to the centre of each value's
remaining interval (or 0 in a component's dead zone) — the same float32 arithmetic as
:func:`sakura.formats.bitplanes.dequantize`, ``x̂ = ((k_b + ½)·2^(1−b) − 1)·s``, so the factors are
bit-identical to the torch decoder's (docs/pack-format.md §4). The
``A·B + μ`` product runs in torch (BLAS) by default: on this CPU a tiled OpenCL matmul is slower
(``matmul="opencl"`` selects it; see docs/device-backends.md for the measurement).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numpy as np
import torch

from sakura.formats.allocated import low_rank, received_planes
from sakura.formats.bitplanes import FactorBytes, plane_bytes
from sakura.formats.container import Blobs
from sakura.formats.pack import PackInfo, shard_bytes
from sakura.kvcache import KV, kv_pairs
from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.reconstruct.base import Reconstructor
from sakura.runtime.reconstruct.opencl_kernels import KERNELS

# Intel's CPU OpenCL runtime (PyPI ``intel-opencl-rt``) links these; preloaded so its ICD loads
# without LD_LIBRARY_PATH.
_ICD_DEPS = ("libtbb.so.12", "libintlc.so.5", "libimf.so", "libsvml.so", "libirng.so")
_registered = False
_PROBE = "__kernel void probe(__global float *a) { a[get_global_id(0)] *= 2.0f; }"


def _user_tmp(name: str) -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else 0
    path = Path(tempfile.gettempdir()) / f"{name}-{uid}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def icd_candidates() -> list[Path]:
    """Extra OpenCL ICD libraries to register: ``$SAKURA_OPENCL_ICD`` (paths, ``os.pathsep``-separated)
    and Intel's CPU runtime when the ``intel-opencl-rt`` wheel is installed in this environment."""
    out = [Path(p) for p in os.environ.get("SAKURA_OPENCL_ICD", "").split(os.pathsep) if p]
    intel = Path(sys.prefix) / "lib" / "libintelocl.so"
    if intel.is_file():
        out.append(intel)
    return [p for p in dict.fromkeys(out) if p.is_file()]


def register_icds() -> list[str]:
    """Make extra ICDs visible to the OpenCL loader (once, before pyopencl first lists platforms).

    Writes a vendors folder holding the system's ``/etc/OpenCL/vendors/*.icd`` plus the extra
    libraries and points ``OCL_ICD_VENDORS`` at it — unless the user set ``OCL_ICD_VENDORS``."""
    global _registered
    if _registered:
        return []
    _registered = True
    if os.environ.get("OCL_ICD_VENDORS"):
        return []
    libs = []
    for lib in icd_candidates():
        try:
            for dep in _ICD_DEPS:
                if (lib.parent / dep).is_file():
                    ctypes.CDLL(str(lib.parent / dep), mode=ctypes.RTLD_GLOBAL)
            libs.append(lib)
        except OSError:
            continue
    if not libs:
        return []
    entries: dict[str, str] = {}
    system = Path("/etc/OpenCL/vendors")
    if system.is_dir():
        for f in sorted(system.glob("*.icd")):
            entries[f"system-{f.name}"] = f.read_text()
    for i, lib in enumerate(libs):
        entries[f"sakura-{i}.icd"] = f"{lib}\n"
    # content-addressed, created atomically: concurrent processes never see a half-written folder
    digest = hashlib.sha1(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:12]
    base = _user_tmp("sakura-ocl-vendors")
    vendors = base / digest
    if not vendors.is_dir():
        staging = Path(tempfile.mkdtemp(dir=base))
        for name, text in entries.items():
            (staging / name).write_text(text)
        try:
            os.rename(staging, vendors)
        except OSError:  # another process won the race: same content
            shutil.rmtree(staging, ignore_errors=True)
    os.environ["OCL_ICD_VENDORS"] = str(vendors)
    return [str(x) for x in libs]


def import_pyopencl():
    if not os.environ.get("POCL_CACHE_DIR"):
        os.environ["POCL_CACHE_DIR"] = str(_user_tmp("sakura-pocl-cache"))
    # CPU OpenCL devices share the cores with the executor: by default one worker thread, so a
    # rebuild beside an executing shard does not spin idle workers against it (Intel's runtime
    # keeps TBB workers busy-waiting after each kernel: 3x slower rebuilds here otherwise).
    threads = os.environ.get("SAKURA_OPENCL_THREADS", "1")
    os.environ.setdefault("CL_CONFIG_CPU_TBB_NUM_WORKERS", threads)
    os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", threads)
    register_icds()
    try:
        import pyopencl as cl
    except ImportError as e:
        raise BackendUnavailable(f"the opencl reconstructor needs pyopencl and an OpenCL driver "
                                 f"(pip install 'pyopencl[pocl]'): {e}") from None
    return cl


def _first_line(e: BaseException) -> str:
    """The informative line of a driver error: a compiler ``error:`` line when there is one."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    errors = [x for x in lines if "error:" in x]
    return (errors or lines or [type(e).__name__])[0][:160]


def _build(cl, ctx, source: str):
    with warnings.catch_warnings():  # compiler chatter (e.g. Intel's "Compilation started") is not an error
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return cl.Program(ctx, source).build()


def pick_device(cl, platform: str | None = None):
    """(platform, device, context, failures) for the first device that builds a probe kernel.

    ``platform`` (or ``$SAKURA_OPENCL_PLATFORM``) restricts to names containing it. Order: GPUs, then
    PoCL, then the rest — a device whose compiler fails (e.g. PoCL 3.0's LLVM 14 on CPUs it does not
    know, "unknown target CPU 'generic'") is skipped with its reason kept for the error message."""
    want = (platform or os.environ.get("SAKURA_OPENCL_PLATFORM") or "").lower()
    try:
        platforms = cl.get_platforms()
    except Exception as e:  # noqa: BLE001 - pyopencl raises LogicError / RuntimeError with no ICD
        raise BackendUnavailable(f"no OpenCL platform found (install 'pyopencl[pocl]' or a vendor ICD): "
                                 f"{_first_line(e)}") from None
    found = []
    for p in platforms:
        try:
            devices = p.get_devices()
        except Exception:  # noqa: BLE001 - a platform without devices
            devices = []
        found += [(p, d) for d in devices]
    if want:
        found = [(p, d) for p, d in found if want in p.name.lower() or want in d.name.lower()]
        if not found:
            names = ", ".join(p.name for p in platforms) or "none"
            raise BackendUnavailable(f"no OpenCL platform/device matching {want!r} (platforms: {names})")
    if not found:
        raise BackendUnavailable("no OpenCL device found (install 'pyopencl[pocl]' for a CPU device)")
    rank = lambda pd: (0 if pd[1].type & cl.device_type.GPU else  # noqa: E731
                       1 if "portable computing language" in pd[0].name.lower() else 2)
    failures = []
    for p, d in sorted(found, key=rank):
        try:
            ctx = cl.Context([d])
            _build(cl, ctx, _PROBE)
            return p, d, ctx, failures
        except Exception as e:  # noqa: BLE001 - driver/compiler failures of any kind
            failures.append(f"{p.name.strip()} / {d.name.strip()}: {_first_line(e)}")
    hint = ("; on CPUs newer than its LLVM, install Intel's CPU runtime (pip install intel-opencl-rt, "
            "or point SAKURA_OPENCL_ICD at an ICD library)")
    raise BackendUnavailable("no OpenCL device could build a kernel: " + "; ".join(failures) + hint)


class OpenCLReconstructor(Reconstructor):
    name = "opencl"

    def __init__(self, platform: str | None = None, matmul: str = "torch"):
        if matmul not in ("torch", "opencl"):
            raise ValueError(f"matmul must be torch or opencl, not {matmul!r}")
        cl = import_pyopencl()
        self.cl = cl
        self.platform, self.device, self.ctx, self.skipped = pick_device(cl, platform)
        try:
            self.queue = cl.CommandQueue(self.ctx)
            self.program = _build(cl, self.ctx, KERNELS)
        except Exception as e:  # noqa: BLE001 - build / driver failures, one line
            raise BackendUnavailable(f"OpenCL device {self.device.name!r} failed to initialise: "
                                     f"{_first_line(e)}") from None
        self.matmul = matmul
        self._dequant = cl.Kernel(self.program, "dequant")
        self._lowrank = cl.Kernel(self.program, "lowrank")
        self._dequant_groups = cl.Kernel(self.program, "dequant_groups")
        self._lock = threading.Lock()  # one command queue: serialise callers

    @property
    def device_name(self) -> str:
        return f"{self.platform.name.strip()} / {self.device.name.strip()}"

    def _dequant_factor(self, f: FactorBytes, r: int, units: int, transpose: bool) -> tuple[object, tuple]:
        """Launch the dequantisation of one factor; returns (device buffer, shape)."""
        cl, mf = self.cl, self.cl.mem_flags
        raw = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.frombuffer(f.raw, np.uint8))
        L = f.length
        out = cl.Buffer(self.ctx, mf.READ_WRITE, size=max(4, units * L * r * 4))
        if transpose:  # A: (U, n, r)
            shape, strides = (units, L, r), (L * r, r, 1)
        else:  # B: (U, r, d)
            shape, strides = (units, r, L), (r * L, 1, L)
        k = self._dequant
        k.set_args(raw, np.int32(f.bits), np.int32(r), np.int32(units), np.int32(L), np.int32(f.pb), out,
                   *(np.int32(s) for s in strides))
        cl.enqueue_nd_range_kernel(self.queue, k, (f.pb, r, units), None)
        return out, shape

    def factors(self, info: PackInfo, shard: int, *key_blobs, verify: bool = True):
        """(units, A (U, n, r), B (U, r, d), means (U, d)) as numpy float32 — the dequantised factors."""
        if info.version >= 2:  # (v3 is v2 plus a ladder; rungs never reach a reconstructor)
            return self._factors_allocated(info, shard, *key_blobs, verify=verify)
        *(r, b_a, b_b), blobs = key_blobs
        received = shard_bytes(info, shard, r, b_a, b_b, blobs, verify=verify)
        if r == 0:
            return received.units, None, None, received.means
        U = len(received.units)
        with self._lock:
            abuf, ashape = self._dequant_factor(received.a, r, U, transpose=True)
            bbuf, bshape = self._dequant_factor(received.b, r, U, transpose=False)
            a, b = np.empty(ashape, np.float32), np.empty(bshape, np.float32)
            self.cl.enqueue_copy(self.queue, a, abuf, is_blocking=False)
            self.cl.enqueue_copy(self.queue, b, bbuf, is_blocking=True)
        return received.units, a, b, received.means

    def _factors_allocated(self, info, shard: int, k: int, blobs: Blobs, *, verify: bool = True):
        """:meth:`factors` of a v2 pack: chunks decoded on the host (zstd), then one launch per factor
        (``dequant_groups``: every component at its group's plane count). A comes back ``(U, n, r)``, or
        ``(1, n, r)`` for a shared token basis."""
        geo = info.geometry
        units, means, planes, groups = received_planes(info, shard, k, blobs, verify=verify)
        if not groups:
            return units, None, None, means
        cl, mf = self.cl, self.cl.mem_flags
        sizes = [geo.group_size(g) for g in groups]
        r = sum(sizes)
        out = []
        with self._lock:
            for f, length, U in ((0, geo.n, info.a_units(shard)), (1, geo.d, len(units))):
                pb = plane_bytes(length)
                parts = [planes[f][g][0] for g in groups]  # plane-0 records, component order
                pos = sum(map(len, parts))
                off, nbits, j = np.zeros((r, 8), np.int32), np.zeros(r, np.int32), 0
                for g, size in zip(groups, sizes):
                    nbits[j:j + size] = len(planes[f][g])
                    for p, plane in enumerate(planes[f][g][1:], start=1):
                        off[j:j + size, p] = pos + np.arange(size) * U * pb
                        parts.append(plane)
                        pos += len(plane)
                    j += size
                raw = cl.Buffer(
                    self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.frombuffer(b"".join(parts), np.uint8)
                )
                offs = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=off)
                bits = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=nbits)
                res = np.empty((U, r, length), np.float32)
                buf = cl.Buffer(self.ctx, mf.WRITE_ONLY, size=res.nbytes)
                self._dequant_groups.set_args(raw, offs, bits, np.int32(U), np.int32(length), np.int32(pb), buf,
                                              np.int32(r * length), np.int32(length))
                cl.enqueue_nd_range_kernel(self.queue, self._dequant_groups, (pb, r, U), None)
                cl.enqueue_copy(self.queue, res, buf, is_blocking=True)
                out.append(res)
        return units, out[0].transpose(0, 2, 1), out[1], means

    def rebuild(self, info: PackInfo, shard: int, *key_blobs, verify: bool = True) -> KV:
        geo = info.geometry
        if info.version == 1 and key_blobs[0] and self.matmul == "opencl":
            return self._rebuild_on_device(info, shard, *key_blobs, verify)
        units, a, b, means = self.factors(info, shard, *key_blobs, verify=verify)
        m = torch.from_numpy(means)
        if a is None:
            kv = m[:, None, :].expand(len(units), geo.n, geo.d).clone()
        else:
            kv = low_rank(m, torch.from_numpy(a), torch.from_numpy(b))
        return kv_pairs(dict(zip(units, kv)))

    def _rebuild_on_device(self, info, shard, r, b_a, b_b, blobs, verify) -> KV:
        cl, mf = self.cl, self.cl.mem_flags
        received = shard_bytes(info, shard, r, b_a, b_b, blobs, verify=verify)
        U, n, d = len(received.units), received.n, received.d
        with self._lock:
            abuf, _ = self._dequant_factor(received.a, r, U, transpose=True)
            bbuf, _ = self._dequant_factor(received.b, r, U, transpose=False)
            mbuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=received.means)
            obuf = cl.Buffer(self.ctx, mf.WRITE_ONLY, size=U * n * d * 4)
            k = self._lowrank
            k.set_args(abuf, bbuf, mbuf, obuf, np.int32(n), np.int32(r), np.int32(d))
            up = lambda x: -(-x // 16) * 16  # noqa: E731
            cl.enqueue_nd_range_kernel(self.queue, k, (up(d), up(n), U), (16, 16, 1))
            out = np.empty((U, n, d), np.float32)
            cl.enqueue_copy(self.queue, out, obuf, is_blocking=True)
        return kv_pairs(dict(zip(received.units, torch.from_numpy(out))))
