"""Shard executors: how the device runs the blocks of a masked edit (torch eager or ExecuTorch).

>>> ex = get_executor("executorch", adapter)     # "eager" | "executorch"
>>> run = ex.prepare(req, shard_size=2)           # exports (cached) / loads one program per shard
>>> run.begin_step(0); run.run_shard(0, 0, 2, kv); ...; run.end_step(0)
>>> image = run.result()

See :mod:`sakura.runtime.executors.base` for the protocol and docs/device-backends.md.
"""

from __future__ import annotations

from sakura.model.base import DiTAdapter
from sakura.runtime.executors.base import Executor, ShardExecutionError, ShardRun, ShardSignature, Timings
from sakura.runtime.executors.errors import BackendUnavailable

EXECUTORS = ("eager", "executorch")


def get_executor(name: str, adapter: DiTAdapter, **options) -> Executor:
    """An executor by name. ``executorch`` options: ``cache_dir``, ``offload``, ``log``;
    ``eager``: ``explicit`` (explicit softmax attention, as exported graphs compute it)."""
    if name == "eager":
        from sakura.runtime.executors.eager import EagerExecutor

        return EagerExecutor(adapter, **options)
    if name in ("executorch", "xnnpack"):
        from sakura.runtime.executors.executorch_backend import ExecuTorchExecutor

        return ExecuTorchExecutor(adapter, **options)
    if name == "qnn":
        from sakura.runtime.executors.executorch_backend import check_qnn_sdk

        check_qnn_sdk()
        raise BackendUnavailable("qnn programs run on a Snapdragon device, not on this host: "
                                 "export them with `sakura export --backend qnn` and run them there")
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


def export_shards(*args, **kwargs):
    """See :func:`sakura.runtime.executors.executorch_backend.export_shards` (imports lazily)."""
    from sakura.runtime.executors.executorch_backend import export_shards as _export

    return _export(*args, **kwargs)


__all__ = ["BackendUnavailable", "EXECUTORS", "Executor", "ShardExecutionError", "ShardRun", "ShardSignature",
           "Timings", "export_shards", "get_executor"]
