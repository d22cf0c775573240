"""Shard executors: how the device runs the blocks of a masked edit (torch eager or ExecuTorch).

>>> ex = get_executor("executorch", adapter)     # "eager" | "executorch"
>>> run = ex.prepare(req, shard_size=2)           # exports (cached) / loads one program per shard
>>> run.begin_step(0); run.run_shard(0, 0, 2, kv); ...; run.end_step(0)
>>> image = run.result()

See :mod:`sakura.runtime.executors.base` for the shard protocol, :mod:`sakura.runtime.executors.executor`
for executors, and docs/device-backends.md.
"""

from __future__ import annotations

from sakura.model.base import DiTAdapter
from sakura.runtime.executors.base import ShardExecutionError, ShardRun, ShardSignature, Timings
from sakura.runtime.executors.eager import EagerExecutor
from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.executors.executor import Executor
from sakura.runtime.executors.executorch_backend import ExecuTorchExecutor, check_qnn_sdk, export_shards

EXECUTORS = ("eager", "executorch")


def get_executor(name: str, adapter: DiTAdapter, **options) -> Executor:
    """An executor by name. ``executorch`` options: ``cache_dir``, ``offload``, ``log``;
    ``eager``: ``explicit`` (explicit softmax attention, as exported graphs compute it)."""
    if name == "eager":
        return EagerExecutor(adapter, **options)
    if name in ("executorch", "xnnpack"):
        return ExecuTorchExecutor(adapter, **options)
    if name == "qnn":
        check_qnn_sdk()
        raise BackendUnavailable("qnn programs run on a Snapdragon device, not on this host: "
                                 "export them with `sakura export --backend qnn` and run them there")
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


__all__ = ["BackendUnavailable", "EXECUTORS", "Executor", "ShardExecutionError", "ShardRun", "ShardSignature",
           "Timings", "export_shards", "get_executor"]
