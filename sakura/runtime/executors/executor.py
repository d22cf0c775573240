"""An executor: a way to execute the shards of a masked edit (see :mod:`sakura.runtime.executors.base`)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch

from sakura.model.base import DiTAdapter, EditRequest, EditResult, Provider
from sakura.runtime.executors.base import ShardFn, ShardRun
from sakura.runtime.executors.flux2 import run_class_for


class Executor(ABC):
    """A way to execute shards. Subclasses give the shard function; the run logic is shared."""

    name: str = ""

    def __init__(self, adapter: DiTAdapter):
        self.adapter = adapter

    @abstractmethod
    def _shard_fn(self, run: ShardRun, l0: int, l1: int) -> ShardFn:
        """A callable ``inputs -> outputs`` for the shard ``[l0, l1)`` of ``run``'s geometry."""

    def prepare(self, req: EditRequest, shard_size: int = 1, *, load: bool = True) -> ShardRun:
        """Everything static per request/template; ``load`` builds all shard functions now."""
        t0 = time.perf_counter()
        run = run_class_for(self.adapter)(self.adapter, req, shard_size, self._shard_fn)
        run.timings.prepare_s = time.perf_counter() - t0
        if load:
            run.load_all()
        return run

    @torch.no_grad()
    def run_masked_edit(self, req: EditRequest, provider: Provider, shard_size: int = 1) -> EditResult:
        """The same edit as ``adapter.masked_edit(req, provider)``, executed shard by shard."""
        run = self.prepare(req, shard_size)
        t0 = time.perf_counter()
        img = run.run(provider)
        return EditResult(img, time.perf_counter() - t0,
                          extras={"executor": self.name, "timings": run.timings.as_dict()})
