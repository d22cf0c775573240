"""How an edit executes, one runner per kind of system, each on the real and the simulated clock.

* :class:`StreamRunner` — the cache streams during the edit (SAKURA and the streaming baselines):
  receive → rebuild → execute in threads over a paced link, or the discrete-event replay.
* :class:`LocalRunner` — no cache: the whole model on every token (``local``).
* :class:`OracleRunner` — the FP16 cache is on the device already: masked compute only (``oracle``).

A runner reads what it needs from its :class:`EditContext` (the edit session is one); which runner a
system uses is in the systems registry (``sakura.systems``).
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

import numpy as np

from sakura.formats import KV, StreamEncoding
from sakura.kvcache import shard_of_layers
from sakura.model import DiTAdapter, EditRequest, LocalSwitch
from sakura.net.paced import PacedLink
from sakura.net.traces import Trace
from sakura.net.unpaced import UnpacedLink
from sakura.online.fallback import FallbackContext
from sakura.online.policies import Policy
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.prefetch import Prefetched
from sakura.runtime.sim import LinkModel, simulate, simulate_masked
from sakura.runtime.stream import StreamedEdit
from sakura.runtime.timeline import Timeline
from sakura.systems import System


class EditContext(Protocol):
    """What a runner reads of one edit (:class:`sakura.runtime.session.EditSession` provides it)."""

    system: System
    model: DiTAdapter
    compute: ComputeProfile
    runtime: Any  # (its ``calibration`` keeps the round trips a real run measured)
    source: Any  # the template's byte source (fetch_timed)
    trace: Trace  # the link, scaled for this edit
    network: Any  # (its ``kernel``: the kernel-shaped link, None: paced by the device)
    start: float  # where in the trace the edit starts
    initial_bps: float
    timeout_s: float
    estimator: str
    executor: Any  # None: the eager masked run
    on_event: Callable[[dict], None] | None
    file_id: str | None  # streaming systems: the stored file, its encoding and policy
    encoding: StreamEncoding | None
    policy: Policy | None
    prefetched: Prefetched | None

    def fallback_context(self) -> FallbackContext | None: ...

    def link_model(self) -> LinkModel: ...

    def reference_kv(self) -> KV: ...

    def reference(self, req: EditRequest, key=None) -> np.ndarray: ...

    def local_output(self, req: EditRequest, key=None) -> np.ndarray: ...


@dataclass
class Outcome:
    image: np.ndarray
    timeline: Timeline


class Runner(ABC):
    @abstractmethod
    def run(self, session: EditContext, req: EditRequest) -> Outcome: ...

    @abstractmethod
    def simulate(self, session: EditContext, req: EditRequest, *, request_key=None, **kw) -> Outcome: ...


class StreamRunner(Runner):
    def run(self, session, req):
        tl = Timeline.for_shards(session.system.name, "real", session.compute.shards, session.on_event,
                                 trace_start_s=session.start)
        kernel = session.network.kernel
        # a kernel link: tc shapes the loopback along the trace from now, the device reads as fast as it can
        link = UnpacedLink(session.source) if kernel is not None else PacedLink(session.source, session.trace,
                                                                                  session.start)
        edit = StreamedEdit(session.model, session.encoding, session.policy, link, session.file_id, session.compute,
                            session.initial_bps, timeout_s=session.timeout_s, executor=session.executor,
                            estimator=session.estimator, fallback=session.fallback_context(),
                            prefetched=session.prefetched,
                            initial_round_trip_s=session.runtime.calibration.request_overhead_s or 0.0,
                            rebuild_prior_s_per_work=session.rebuild_prior_s_per_work)
        with contextlib.ExitStack() as shaped:
            if kernel is not None:
                replay = shaped.enter_context(kernel.replaying(session.trace, session.start))
                tl.extras["link"] = "kernel"
            try:
                result = edit.run(req, tl)
            finally:
                link.close()
                if kernel is None:  # (on a kernel link a first byte waits for tc too: not the device's round trip)
                    session.runtime.calibration.record_round_trips(link.round_trips)
            if kernel is not None:
                tl.extras["kernel_rates"] = [[round(t, 4), round(r, 4)] for t, r in replay.changes]
        if link.outages:  # stretches no source answered (the fallbacks decided meanwhile)
            tl.extras["source_outages"] = link.outages
        return Outcome(result.image, tl)

    def simulate(self, session, req, *, request_key=None, timer: Callable[[], float] = time.perf_counter,
                 unpaced: bool = False, replay: ComputeProfile | None = None, **kw):
        """``timer`` measures the real decodes; it must be the clock compute was measured on. ``unpaced``: the
        link as the device reads a kernel-shaped one (:class:`sakura.runtime.sim.LinkModel`). ``replay``: the
        compute a real run of this edit did (:meth:`ComputeProfile.as_run`), executed while the device still
        plans with its calibrated one."""
        def fetch(ranges):
            return session.source.fetch_timed(session.file_id, ranges).parts

        tl, kv = simulate(
            session.encoding,
            session.policy,
            replay or session.compute,
            replace(session.link_model(), unpaced=unpaced),
            fetch,
            timer=timer,
            estimator=session.estimator,
            fallback=session.fallback_context(),
            prefetched=session.prefetched,
            recompute=lambda: session.model.recompute_first_step(req),
            predicted=session.compute,
            rebuild_prior_s_per_work=session.rebuild_prior_s_per_work,
            **kw,
        )
        local_from = tl.extras.get("local_from_step")

        def provider(step, layer):
            if local_from is not None and step >= local_from:
                raise LocalSwitch
            return kv[(step, layer)]

        if session.executor is not None:  # the output of the programs that would run (no local switch with them)
            shard_size = session.compute.shards[0][2] - session.compute.shards[0][1]
            return Outcome(session.executor.run_masked_edit(req, provider, shard_size).image, tl)
        return Outcome(session.model.masked_edit(req, provider).image, tl)


class LocalRunner(Runner):
    def run(self, session, req):
        res = session.model.full_edit(req)
        return Outcome(res.image, Timeline(session.system.name, "real", latency_s=res.seconds,
                                           trace_start_s=session.start))

    def simulate(self, session, req, *, request_key=None, **kw):
        tl = Timeline(session.system.name, "sim", latency_s=session.compute.local_full_s, trace_start_s=session.start)
        return Outcome(session.local_output(req, request_key), tl)


class OracleRunner(Runner):
    """The cache was fetched before the edit (untimed, template data only); the edit is a masked run."""

    def run(self, session, req):
        kv = session.reference_kv()
        tl = Timeline.for_shards(session.system.name, "real", session.compute.shards, session.on_event,
                                 trace_start_s=session.start)
        shard_of = shard_of_layers(session.compute.shards)
        t0 = time.perf_counter()

        def provider(step: int, layer: int):
            j = shard_of[(step, layer)]
            if tl.shards[j].exec_start_t is None:
                now = time.perf_counter() - t0
                if j > 0:
                    tl.shard_ended(j - 1, now)
                tl.shard_started(j, now)
            return kv[(step, layer)]

        res = session.model.masked_edit(req, provider)
        tl.latency_s = time.perf_counter() - t0
        if tl.shards:
            tl.shard_ended(len(tl.shards) - 1, tl.latency_s)
        return Outcome(res.image, tl)

    def simulate(self, session, req, *, request_key=None, **kw):
        tl = simulate_masked(session.system.name, session.compute)
        tl.trace_start_s = session.start
        return Outcome(session.reference(req, request_key), tl)


RUNNERS: dict[str, type[Runner]] = {"stream": StreamRunner, "local": LocalRunner, "oracle": OracleRunner}


def get_runner(kind: str) -> Runner:
    if kind not in RUNNERS:
        raise KeyError(f"unknown runner {kind!r}; known: {', '.join(RUNNERS)}")
    return RUNNERS[kind]()
