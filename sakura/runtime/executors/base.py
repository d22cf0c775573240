"""The executor seam: run a masked edit shard by shard so the runtime can time and overlap it.

A *shard* is a group of consecutive attention layers at one step (the same grouping as cache
shards, :func:`sakura.kvcache.shard_plan`). An executor (:mod:`sakura.runtime.executors.executor`)
turns a request into a :class:`ShardRun`, the family-specific driver defined here::

    ex = get_executor("executorch", adapter)           # or "eager"
    run = ex.prepare(req, shard_size=2)                 # static per template: exports/loads graphs
    for step in range(run.num_steps):
        run.begin_step(step)                            # embeddings, timestep modulation (torch)
        for l0, l1 in run.layer_ranges:
            run.run_shard(step, l0, l1, kv)             # kv: {(step, layer): (K, V)}, each (n, heads*head_dim)
        run.end_step(step)                              # output head + flow-matching update (torch)
    image = run.result()

The pre/post parts of the transformer forward (input projections, timestep embedding and
modulation, RoPE tables, output norm/projection) are request-constant or tiny and run in torch in
``begin_step`` / ``end_step``; the blocks — nearly all of the compute — run in ``run_shard`` on the
executor's backend. Every part reuses the diffusers submodules of the adapter's transformer (no
weight copies). ``run.timings`` records the wall time of every call.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from sakura.kvcache import shard_layers
from sakura.model.base import DiTAdapter, EditRequest, Provider

KV = Mapping[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]
ShardFn = Callable[[list[torch.Tensor]], Sequence[torch.Tensor]]


class ShardExecutionError(ValueError):
    """A shard run used out of order or with missing K/V, or a model the shard path cannot split."""


@dataclass(frozen=True)
class ShardSignature:
    """What an exported shard graph is specialised on: everything static per template geometry.

    Positions (RoPE tables), modulation and the reusable K/V are graph *inputs*, so one exported
    shard serves every step and every template of the same geometry on the same weights."""

    family: str
    model_id: str
    num_img: int  # computed image-stream tokens: masked image tokens + reference tokens
    num_txt: int
    num_reuse: int  # reusable (cached) image tokens: rows of every K/V input
    heads: int
    head_dim: int
    l0: int
    l1: int
    dtype: str = "float32"

    @property
    def dim(self) -> int:
        return self.heads * self.head_dim


@dataclass
class Timings:
    prepare_s: float = 0.0
    begin: list[tuple[int, float]] = field(default_factory=list)  # (step, s)
    shards: list[tuple[int, int, int, float]] = field(default_factory=list)  # (step, l0, l1, s)
    end: list[tuple[int, float]] = field(default_factory=list)

    def shard_seconds(self) -> dict[tuple[int, int, int], float]:
        return {(s, a, b): t for s, a, b, t in self.shards}

    def as_dict(self) -> dict:
        return {"prepare_s": self.prepare_s, "begin": self.begin, "end": self.end,
                "shards": [list(x) for x in self.shards]}


class ShardRun(ABC):
    """One request's masked run, driven step by step and shard by shard (family-specific subclasses)."""

    def __init__(self, adapter: DiTAdapter, req: EditRequest, shard_size: int, shard_fn_factory):
        adapter.validate(req)
        self.adapter, self.req, self.shard_size = adapter, req, shard_size
        self.layer_ranges = shard_layers(adapter.num_layers, shard_size)
        self.num_steps = adapter.num_steps
        self.timings = Timings()
        self._expect = (0, "begin", 0)  # (step, phase, next shard index)
        self._make_fn = shard_fn_factory
        self._fns: dict[tuple[int, int], ShardFn] = {}
        self._setup()

    # -- family hooks -------------------------------------------------------------------------
    @abstractmethod
    def _setup(self) -> None:
        """Request-constant tensors (tokens, masks, text states, positions)."""

    @abstractmethod
    def signature(self, l0: int, l1: int) -> ShardSignature: ...

    def graph_constants(self) -> str:
        """What an exported shard bakes in beyond its signature and weights (e.g. a locality bias that
        depends on where the masked and reusable tokens lie); part of the exported program's key."""
        return ""

    @abstractmethod
    def shard_module(self, l0: int, l1: int) -> torch.nn.Module:
        """The blocks of ``[l0, l1)`` as a module taking ``self.example_inputs(l0, l1)`` positionally."""

    @abstractmethod
    def input_names(self, l0: int, l1: int) -> list[str]: ...

    @abstractmethod
    def _pre(self, step: int) -> None: ...

    @abstractmethod
    def _stream_inputs(self, l0: int, l1: int) -> list[torch.Tensor]:
        """The non-K/V inputs of a shard from the current stream state (names as ``input_names``)."""

    @abstractmethod
    def _take_outputs(self, outputs: Sequence[torch.Tensor]) -> None: ...

    @abstractmethod
    def _post(self, step: int) -> None: ...

    @abstractmethod
    def _image(self) -> np.ndarray: ...

    @abstractmethod
    def masked_context(self):
        """Context manager putting the adapter's processors in masked mode for tracing/running a shard."""

    # -- shared driving -------------------------------------------------------------------------
    def example_inputs(self, l0: int, l1: int) -> tuple[torch.Tensor, ...]:
        """Inputs of the right shapes (for export), from a begin_step(0) on a scratch copy of the state."""
        saved = self._state_snapshot()
        try:
            self._pre(0)
            n, d = self.signature(l0, l1).num_reuse, self.signature(l0, l1).dim
            g = torch.Generator().manual_seed(0)
            kv = [torch.randn(n, d, generator=g, dtype=self.adapter.dtype) for _ in range(2 * (l1 - l0))]
            return tuple(t.contiguous() for t in self._stream_inputs(l0, l1)) + tuple(kv)
        finally:
            self._state_restore(saved)

    def _state_snapshot(self):
        return dict(self.__dict__)

    def _state_restore(self, saved) -> None:
        self.__dict__.clear()
        self.__dict__.update(saved)

    def fn(self, l0: int, l1: int) -> ShardFn:
        key = (l0, l1)
        if key not in self._fns:
            self._fns[key] = self._make_fn(self, l0, l1)
        return self._fns[key]

    def load_all(self) -> None:
        """Build / load every shard function now (export and load time off the critical path)."""
        t0 = time.perf_counter()
        for l0, l1 in self.layer_ranges:
            self.fn(l0, l1)
        self.timings.prepare_s += time.perf_counter() - t0

    @property
    def shards(self) -> list[tuple[int, int, int]]:
        return [(s, a, b) for s in range(self.num_steps) for a, b in self.layer_ranges]

    def begin_step(self, step: int) -> None:
        if self._expect != (step, "begin", 0):
            raise ShardExecutionError(f"begin_step({step}) out of order (expected {self._expect})")
        t0 = time.perf_counter()
        self._pre(step)
        self.timings.begin.append((step, time.perf_counter() - t0))
        self._expect = (step, "shard", 0)

    def run_shard(self, step: int, l0: int, l1: int, kv: KV) -> None:
        at_step, phase, i = self._expect
        if phase != "shard" or at_step != step or i >= len(self.layer_ranges) or self.layer_ranges[i] != (l0, l1):
            raise ShardExecutionError(f"run_shard({step}, {l0}, {l1}) out of order (expected {self._expect}, "
                                      f"shards {self.layer_ranges})")
        dt = self.adapter.dtype
        kvs: list[torch.Tensor] = []
        for layer in range(l0, l1):
            try:
                k, v = kv[(step, layer)]
            except KeyError:
                raise ShardExecutionError(f"no K/V for (step {step}, layer {layer})") from None
            kvs += [k.to(dt).contiguous(), v.to(dt).contiguous()]
        inputs = [t.contiguous() for t in self._stream_inputs(l0, l1)] + kvs
        fn = self.fn(l0, l1)
        t0 = time.perf_counter()
        out = fn(inputs)
        self.timings.shards.append((step, l0, l1, time.perf_counter() - t0))
        self._take_outputs(out)
        self._expect = (step, "shard", i + 1) if i + 1 < len(self.layer_ranges) else (step, "end", 0)

    def end_step(self, step: int) -> None:
        if self._expect != (step, "end", 0):
            raise ShardExecutionError(f"end_step({step}) out of order (expected {self._expect})")
        t0 = time.perf_counter()
        self._post(step)
        self.timings.end.append((step, time.perf_counter() - t0))
        self._expect = (step + 1, "begin", 0) if step + 1 < self.num_steps else (step + 1, "done", 0)

    def result(self) -> np.ndarray:
        if self._expect[1] != "done":
            raise ShardExecutionError(f"result() before the last step finished (at {self._expect})")
        return self._image()

    def run(self, provider: Provider) -> np.ndarray:
        """Drive every step and shard with K/V from ``provider(step, layer)``."""
        for step in range(self.num_steps):
            self.begin_step(step)
            for l0, l1 in self.layer_ranges:
                self.run_shard(step, l0, l1, {(step, layer): provider(step, layer) for layer in range(l0, l1)})
            self.end_step(step)
        return self.result()
