"""ExecuTorch shard execution: each shard exported to a ``.pte`` (XNNPACK here, QNN for Snapdragon HTP).

Export path (per shard, static per template geometry)::

    torch.export.export(Flux2Shard, example_inputs)        # through our processors, explicit softmax
    → to_edge_transform_and_lower(..., partitioner=[XnnpackPartitioner()]) → .to_executorch() → .pte

The reusable K/V of the shard's layers, the RoPE tables and the modulations are graph inputs, so a
file serves every step (and every template with the same token counts on the same weights). Files
are cached under ``$SAKURA_PTE_CACHE`` (default ``~/.cache/sakura/pte``), named by model id, layers
and a key over geometry + weights + toolchain versions; a JSON sidecar records export time, size and
the export-time check against eager. Run with
``executorch.runtime.Runtime.get().load_program(path).load_method("forward").execute([...])``.

The QNN path (:func:`export_qnn`) quantises W8A16 like the paper and lowers with the Qualcomm
partitioner; it runs only with a QNN SDK at ``$QNN_SDK_ROOT`` and never imports the Qualcomm backend
otherwise (its setup would try to download an SDK).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from importlib.metadata import version
from pathlib import Path
from typing import Callable, Iterable

import torch

from sakura.model.base import DiTAdapter, EditRequest
from sakura.runtime.executors.base import ShardFn, ShardRun
from sakura.runtime.executors.eager import EagerExecutor
from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.executors.executor import Executor

BACKENDS = ("xnnpack", "qnn")
EXPORT_TOLERANCE = 1e-3  # max abs difference of an exported shard's outputs vs eager (explicit) on export
QNN_HOST_LIB = Path("lib") / "x86_64-linux-clang" / "libQnnHtp.so"
DEFAULT_SOC = "SM8650"  # Snapdragon 8 Gen 3 (HTP v75)


def pte_cache_dir() -> Path:
    return Path(os.environ.get("SAKURA_PTE_CACHE") or Path.home() / ".cache" / "sakura" / "pte")


def require_executorch() -> str:
    """The ExecuTorch version, or BackendUnavailable naming what to install."""
    try:
        import executorch  # noqa: F401
        from executorch.runtime import Runtime  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(f"the executorch backend needs the 'executorch' package (pip install "
                                 f"executorch==1.5.1): {e}") from None
    try:
        return version("executorch")
    except Exception:  # noqa: BLE001 - a missing dist-info only loses the version in the cache key
        return "unknown"


def pool_threads() -> int | None:
    """The size of ExecuTorch's CPU thread pool (None when ExecuTorch is not installed)."""
    try:
        from executorch.extension.pybindings import portable_lib as pool
    except ImportError:
        return None
    return pool._threadpool_get_thread_count()


def set_threads(n: int) -> int | None:
    """Size ExecuTorch's CPU thread pool (XNNPACK's workers) to ``n`` — e.g. torch's intra-op threads, so a
    comparison gives both stacks the same cores. Call before any program is loaded (resetting the pool under
    loaded programs crashes the process). Returns the previous size (None when ExecuTorch is not installed)."""
    try:
        from executorch.extension.pybindings import portable_lib as pool
    except ImportError:
        return None
    before = pool._threadpool_get_thread_count()
    if n and n != before:
        pool._unsafe_reset_threadpool(int(n))
    return before


def check_qnn_sdk() -> Path:
    """The QNN SDK root from ``$QNN_SDK_ROOT``, or BackendUnavailable saying what is missing.

    Checked before anything from ``executorch.backends.qualcomm`` is imported: its setup downloads
    an SDK when none is configured, which must never happen implicitly."""
    root = os.environ.get("QNN_SDK_ROOT", "")
    if not root:
        raise BackendUnavailable("the qnn backend needs the Qualcomm AI Engine Direct (QNN) SDK: set QNN_SDK_ROOT "
                                 f"to its folder (one that has {QNN_HOST_LIB}); QNN_SDK_ROOT is not set")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise BackendUnavailable(f"QNN_SDK_ROOT={root} is not a folder: point it at the QNN SDK "
                                 f"(one that has {QNN_HOST_LIB})")
    if not (path / QNN_HOST_LIB).is_file():
        raise BackendUnavailable(f"QNN_SDK_ROOT={root} has no {QNN_HOST_LIB}: not a QNN SDK for x86_64 hosts")
    return path


# ------------------------------------------------------------------------------------------- keys


_FINGERPRINTS: dict[tuple, str] = {}  # (tensor identity, data pointer, version) of every weight -> its hash


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A hash of the module's weights, remembered while no weight changes: every in-place write (training, a
    state-dict load) bumps a tensor's version and so misses the memo. A program's key is checked at every
    edit's prepare; hashing the bytes each time cost ≈ 60 ms per edit here."""
    tensors = sorted(module.state_dict(keep_vars=True).items())
    memo = tuple((name, id(t), t.data_ptr(), t._version, tuple(t.shape), str(t.dtype)) for name, t in tensors)
    if memo not in _FINGERPRINTS:
        if len(_FINGERPRINTS) > 256:
            _FINGERPRINTS.clear()
        _FINGERPRINTS[memo] = _hash_weights(module)
    return _FINGERPRINTS[memo]


def _hash_weights(module: torch.nn.Module) -> str:
    h = hashlib.sha1()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode() + str(t.dtype).encode())
        h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def shard_key(run: ShardRun, l0: int, l1: int, backend: str, extra: str = "") -> str:
    sig = run.signature(l0, l1)
    fp = weights_fingerprint(run.shard_module(l0, l1))
    text = json.dumps({"sig": sig.__dict__, "weights": fp, "backend": backend, "torch": torch.__version__,
                       "executorch": require_executorch(), "attention": "explicit", "extra": extra,
                       "constants": run.graph_constants()},
                      sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def shard_path(run: ShardRun, l0: int, l1: int, backend: str = "xnnpack", cache_dir: Path | None = None,
               extra: str = "") -> Path:
    sig = run.signature(l0, l1)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in sig.model_id) or "model"
    key = shard_key(run, l0, l1, backend, extra)
    name = f"{safe}-L{l0}_{l1}-i{sig.num_img}-t{sig.num_txt}-n{sig.num_reuse}-{backend}-{key}.pte"
    return Path(cache_dir or pte_cache_dir()) / name


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------- export


def _trace(run: ShardRun, l0: int, l1: int):
    module = run.shard_module(l0, l1).eval()
    inputs = run.example_inputs(l0, l1)
    with torch.no_grad(), run.masked_context(True):
        expected = [t.clone() for t in module(*inputs)]
        ep = torch.export.export(module, inputs, strict=False)
    return ep, inputs, expected


def lower_xnnpack(ep) -> tuple[bytes, int]:
    """An exported program lowered with the XNNPACK partitioner: (the .pte bytes, delegated partitions)."""
    require_executorch()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    delegated = sum(1 for n in edge.exported_program().graph.nodes
                    if n.op == "call_function" and "call_delegate" in str(n.target))
    return edge.to_executorch().buffer, delegated


def check_program(path: Path, inputs, expected, what: str) -> float:
    """Run the program at ``path`` on ``inputs`` and compare with the eager ``expected`` outputs: the max abs
    difference; above :data:`EXPORT_TOLERANCE` the file is deleted and this raises."""
    from executorch.runtime import Runtime

    out = Runtime.get().load_program(str(path)).load_method("forward").execute(list(inputs))
    err = max(float((a.float() - b.float()).abs().max()) if a.numel() else 0.0 for a, b in zip(out, expected))
    if not err <= EXPORT_TOLERANCE:
        path.unlink(missing_ok=True)
        raise RuntimeError(f"exported {what} differs from eager by {err:.3g} (> {EXPORT_TOLERANCE})")
    return err


def export_module(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], path: Path, what: str = "program",
                  verify: bool = True) -> dict:
    """Export any module (explicit attention only: no SDPA) to an XNNPACK ``.pte`` at ``path``; the non-shard
    programs of a phone bundle go through here. Returns its metadata (no sidecar is written)."""
    t0 = time.perf_counter()
    module = module.eval()
    inputs = tuple(t.contiguous() for t in inputs)
    with torch.no_grad():
        expected = [t.clone() for t in _as_tuple(module(*inputs))]
        ep = torch.export.export(module, inputs, strict=False)
    t1 = time.perf_counter()
    buf, delegated = lower_xnnpack(ep)
    t2 = time.perf_counter()
    _write_atomic(path, buf)
    meta = {"backend": "xnnpack", "trace_s": round(t1 - t0, 3), "lower_s": round(t2 - t1, 3),
            "export_s": round(t2 - t0, 3), "bytes": len(buf), "delegates": delegated}
    if verify:
        meta["max_abs_vs_eager"] = check_program(path, inputs, expected, what)
    return meta


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def export_xnnpack(run: ShardRun, l0: int, l1: int, path: Path, verify: bool = True) -> dict:
    """Export shard ``[l0, l1)`` of ``run``'s geometry to ``path`` (XNNPACK fp32). Returns its metadata."""
    require_executorch()
    t0 = time.perf_counter()
    ep, inputs, expected = _trace(run, l0, l1)
    t1 = time.perf_counter()
    buf, delegated = lower_xnnpack(ep)
    t2 = time.perf_counter()
    _write_atomic(path, buf)
    meta = {"backend": "xnnpack", "layers": [l0, l1], "signature": run.signature(l0, l1).__dict__,
            "trace_s": round(t1 - t0, 3), "lower_s": round(t2 - t1, 3), "export_s": round(t2 - t0, 3),
            "bytes": len(buf), "delegates": delegated}
    if verify:
        meta["max_abs_vs_eager"] = check_program(path, inputs, expected, f"shard [{l0}, {l1})")
    _write_atomic(path.with_suffix(".json"), json.dumps(meta, indent=1).encode())
    return meta


def export_qnn(run: ShardRun, l0: int, l1: int, path: Path, soc: str = DEFAULT_SOC,
               calibration: Iterable[tuple[torch.Tensor, ...]] | None = None) -> dict:
    """Export shard ``[l0, l1)`` for the Snapdragon HTP: W8A16 post-training quantisation (calibrated
    on ``calibration`` input tuples, default the example inputs) and lowering with the QNN partitioner.

    Raises BackendUnavailable (before importing anything Qualcomm) when no QNN SDK is configured."""
    check_qnn_sdk()
    require_executorch()
    from executorch.backends.qualcomm.quantizer.quantizer import QnnQuantizer, QuantDtype
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset
    from executorch.backends.qualcomm.utils.utils import (
        generate_htp_compiler_spec,
        generate_qnn_executorch_compiler_spec,
        to_edge_transform_and_lower_to_qnn,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if not hasattr(QcomChipset, soc):
        raise BackendUnavailable(f"unknown Snapdragon SoC {soc!r}; one of {', '.join(c.name for c in QcomChipset)}")
    t0 = time.perf_counter()
    ep, inputs, _ = _trace(run, l0, l1)
    quantizer = QnnQuantizer(soc_model=getattr(QcomChipset, soc))
    quantizer.set_default_quant_config(QuantDtype.use_16a8w, is_linear_per_channel=True)  # W8A16, as the paper
    with torch.no_grad():
        prepared = prepare_pt2e(ep.module(), quantizer)
        for sample in (calibration or [inputs]):
            prepared(*sample)
        quantized = convert_pt2e(prepared)
    specs = generate_qnn_executorch_compiler_spec(soc_model=getattr(QcomChipset, soc),
                                                  backend_options=generate_htp_compiler_spec(use_fp16=False))
    edge = to_edge_transform_and_lower_to_qnn(quantized, inputs, specs)
    buf = edge.to_executorch().buffer
    _write_atomic(path, buf)
    meta = {"backend": "qnn", "soc": soc, "quant": "w8a16", "layers": [l0, l1],
            "signature": run.signature(l0, l1).__dict__, "export_s": round(time.perf_counter() - t0, 3),
            "bytes": len(buf)}
    _write_atomic(path.with_suffix(".json"), json.dumps(meta, indent=1).encode())
    return meta


def ensure_exported(run: ShardRun, l0: int, l1: int, backend: str = "xnnpack", cache_dir: Path | None = None,
                    soc: str = DEFAULT_SOC, log: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """The cached ``.pte`` of a shard, exporting it first when missing. Returns (path, metadata)."""
    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown export backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "qnn":
        check_qnn_sdk()
    path = shard_path(run, l0, l1, backend, cache_dir, extra=soc if backend == "qnn" else "")
    side = path.with_suffix(".json")
    if path.is_file():
        meta = json.loads(side.read_text()) if side.is_file() else {}
        return path, {**meta, "cached": True}
    if log:
        log(f"exporting shard layers [{l0}, {l1}) for {backend} → {path.name}")
    meta = export_qnn(run, l0, l1, path, soc) if backend == "qnn" else export_xnnpack(run, l0, l1, path)
    return path, {**meta, "cached": False}


def export_shards(adapter: DiTAdapter, req: EditRequest, shard_size: int = 1, backend: str = "xnnpack",
                  out_dir: Path | None = None, soc: str = DEFAULT_SOC,
                  log: Callable[[str], None] | None = None) -> list[dict]:
    """Export every shard of ``req``'s geometry (what ``sakura export`` runs). One dict per shard."""
    if backend == "qnn":
        check_qnn_sdk()
    run = EagerExecutor(adapter, explicit=True).prepare(req, shard_size, load=False)
    rows = []
    for l0, l1 in run.layer_ranges:
        path, meta = ensure_exported(run, l0, l1, backend, out_dir, soc, log)
        rows.append({"layers": [l0, l1], "path": str(path), **meta})
    return rows


# --------------------------------------------------------------------------------------- executor


class ExecuTorchExecutor(Executor):
    """Shards run as ExecuTorch programs (XNNPACK CPU delegate here).

    ``offload``: which shards run from ``.pte`` files — None = all; else a predicate ``(l0, l1) ->
    bool`` or a set of ``(l0, l1)``; the others run eagerly with the same explicit attention (a
    partial offload, e.g. to keep a shard the NPU cannot take on the CPU)."""

    name = "executorch"

    def __init__(self, adapter: DiTAdapter, backend: str = "xnnpack", cache_dir: Path | str | None = None,
                 offload=None, log: Callable[[str], None] | None = None):
        super().__init__(adapter)
        require_executorch()
        if backend != "xnnpack":
            raise BackendUnavailable(f"running {backend} programs needs the target device (this host runs xnnpack); "
                                     f"export them with `sakura export --backend {backend}`")
        self.backend = backend
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if offload is None or callable(offload):
            self.offload = offload
        else:
            chosen = {tuple(x) for x in offload}
            self.offload = lambda l0, l1: (l0, l1) in chosen
        self.log = log
        self._programs: dict[str, tuple[object, object]] = {}  # path -> (program, method)
        self._exports: dict[str, dict] = {}  # path -> export metadata (what prepare() used)

    @property
    def exports(self) -> list[dict]:
        """Metadata of every shard program this executor has loaded (cached or exported now)."""
        return list(self._exports.values())

    def method(self, path: Path):
        key = str(path)
        if key not in self._programs:
            from executorch.runtime import Runtime

            program = Runtime.get().load_program(key)
            self._programs[key] = (program, program.load_method("forward"))
        return self._programs[key][1]

    def _shard_fn(self, run: ShardRun, l0: int, l1: int) -> ShardFn:
        if self.offload is not None and not self.offload(l0, l1):
            return EagerExecutor(self.adapter, explicit=True)._shard_fn(run, l0, l1)
        path, meta = ensure_exported(run, l0, l1, self.backend, self.cache_dir, log=self.log)
        self._exports[str(path)] = {"layers": [l0, l1], "path": str(path), **meta}
        method = self.method(path)

        def fn(inputs):
            # outputs live in the program's planned memory: copy them out before the next call
            return [t.clone() for t in method.execute(inputs)]

        return fn
