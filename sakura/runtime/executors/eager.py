"""Eager torch execution of shards: the stock diffusers blocks with the adapter's processors.

Numerically this is ``adapter.masked_edit`` split at shard boundaries (same ops, same order);
``explicit=True`` switches attention to the explicit softmax(QKᵀ)V form the exported graphs use.
"""

from __future__ import annotations

import torch

from sakura.model.base import DiTAdapter
from sakura.runtime.executors.base import ShardFn, ShardRun
from sakura.runtime.executors.executor import Executor


class EagerExecutor(Executor):
    name = "eager"

    def __init__(self, adapter: DiTAdapter, explicit: bool = False):
        super().__init__(adapter)
        self.explicit = explicit

    def _shard_fn(self, run: ShardRun, l0: int, l1: int) -> ShardFn:
        module = run.shard_module(l0, l1)

        @torch.no_grad()
        def fn(inputs):
            with run.masked_context(self.explicit):
                return module(*inputs)

        return fn
