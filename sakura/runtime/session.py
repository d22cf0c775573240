"""The edit session: the one place an edit is put together, whoever asks for it.

The device agent, ``sakura edit --stream`` and the benchmark (real or simulated clock) all do::

    runtime = DeviceRuntime(source)                          # once per process: caches live here
    session = runtime.session(template, "sakura", network)   # headers, calibration, scale, policy
    report = session.edit(EditInput(prompt=..., photo=...))  # request, plan, run, reference, quality

:class:`DeviceRuntime` holds what a device keeps across edits: the model of each template, its
stored files' headers (one request each, cached), its calibrated compute and the exact FP16 cache
of a few recent templates (for the reference output). :class:`EditSession` makes every choice of
one edit — regime scale, trace start, link, policy and stored format, runner — so the same
(template, system, network) gives the same choices on every path. ``local`` and ``oracle`` are
runners behind the same interface as the streaming systems (:mod:`sakura.runtime.runners`).
"""

from __future__ import annotations

import copy
import logging
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from sakura.editing import edit_request, model_for
from sakura.formats import FORMATS, KV, StreamEncoding, encoding_from_header, file_id
from sakura.formats.fp16 import Fp16Info
from sakura.model import DiTAdapter, EditRequest
from sakura.net.client import FetchError
from sakura.net.kernel import KernelLink
from sakura.net.paced import DEFAULT_REQUEST_OVERHEAD_S
from sakura.net.refs import resolving
from sakura.net.traces import Trace, paper_regime_scale
from sakura.online.fallback import BOUND_SHARE, FallbackContext
from sakura.online.monitor import DEFAULT_ESTIMATOR
from sakura.online.policies import Policy, get_policy
from sakura.quality import quality
from sakura.runtime.backends import BackendChoice, Backends, eager_only, ran_for
from sakura.runtime.calibration import CalibrationStore, measure_rebuild_rate
from sakura.runtime.compute import ComputeCheck, ComputeProfile
from sakura.runtime.errors import EditCancelled, StreamError, TemplateUnavailable
from sakura.runtime.prefetch import Prefetched, simulate_prefetch
from sakura.runtime.runners import Outcome, get_runner
from sakura.runtime.sim import LinkModel
from sakura.runtime.timeline import EventSink, Timeline
from sakura.systems import System, get_system

log = logging.getLogger(__name__)

REGIMES = ("paper", "none")
PENDING_PRICES_REREAD_S = 10.0  # a header published before its prices is read again at most this often
PLAN_TRACE_WINDOW_S = 30.0  # how much of the link ahead the plan shows
StatusSink = Callable[[str, str], None]  # (stage, message)


@dataclass(frozen=True)
class Network:
    """The link an edit runs over: an (unscaled) trace, where in it the edit starts, and its scale."""

    trace: Trace
    name: str  # what the user called it: 5g, fixed:30, an uploaded file's name
    start: float | None = None  # seconds into the trace; None = a random offset
    scale: float | None = None  # bandwidth multiplier; None = from the regime
    regime: str = "paper"  # paper: FP16 transfer at the median / local generation = 23 s / 13 s; none: scale 1
    # None: the device paces what it reads along the trace (PacedLink); a KernelLink: tc shapes the loopback the
    # server and device share along the same scaled trace, and the device does not pace
    kernel: KernelLink | None = None

    @property
    def link(self) -> str:
        """``paced`` (application pacing) or ``kernel`` (tc)."""
        return "paced" if self.kernel is None else "kernel"

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError(f"regime must be one of {', '.join(REGIMES)}, got {self.regime!r}")


@dataclass(frozen=True)
class EditInput:
    """What the person asked for: a prompt and/or their photo, or one of the template's catalog requests.
    ``key`` names a request whose link-independent outputs (reference, local) a sweep may compute once."""

    prompt: str = ""
    photo: np.ndarray | None = None
    catalog_request: object | None = None
    key: object = None


@dataclass
class EditReport:
    """One edit, whole: what the device made, what it is compared with, and where the time went."""

    request: EditRequest
    image: np.ndarray
    timeline: Timeline
    plan: dict
    summary: dict
    reference: np.ndarray | None = None  # the FP16-reference output (None: not asked for)
    quality: dict | None = None  # PSNR / SSIM of ``image`` against it, in the edited region
    timing: dict[str, float] = field(default_factory=dict)  # wall seconds of this process: edit_s, reference_s


@dataclass
class TemplateState:
    """What the device knows about one template: its model, stored-file headers and measured compute."""

    template: object
    model: DiTAdapter
    fp16: Fp16Info
    compute: ComputeProfile
    headers: dict[str, bytes] = field(default_factory=dict)  # by file id

    @property
    def fp16_bytes(self) -> int:
        """The whole FP16 cache (K and V of every reusable token, step and layer): what an uncompressed
        transfer sends, and what the paper regime is calibrated on."""
        layers = sum(l1 - l0 for _, l0, l1 in self.fp16.shards)
        return 2 * layers * self.fp16.n * self.fp16.d * 2


class Remembered:
    """A few values by key, least recently used dropped first; ``get(key, compute)`` computes a miss
    outside the lock (a slow compute never blocks readers of other keys)."""

    def __init__(self, keep: int) -> None:
        self.keep = max(1, keep)
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key, compute: Callable):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.keep:
                self._items.popitem(last=False)
        return value


def network_scale(network: Network, state: TemplateState) -> float:
    """The bandwidth multiplier of an edit: given, or the paper regime's for this template on this device."""
    if network.scale is not None:
        return float(network.scale)
    if network.regime == "paper":
        return paper_regime_scale(network.trace, state.fp16_bytes, state.compute.local_full_s)
    return 1.0


class DeviceRuntime:
    """Per-process state of a device that runs edits; thread-safe for one edit at a time.

    ``source`` reads template data: anything with ``header_bytes(file_id)`` and ``fetch_timed(file_id,
    ranges)`` — a range client to a template server, an object-store reader, a local folder."""

    def __init__(self, source, *, model_path=None, calibration: CalibrationStore | None = None,
                 reference_caches: int = 2, backends: BackendChoice | Backends | None = None) -> None:
        """``backends``: the executor and reconstructor every edit of this device runs on (default eager +
        torch); resolved by :class:`~sakura.runtime.backends.Backends`, the one place names become backends."""
        self.source, self.model_path = source, model_path
        self.calibration = calibration or CalibrationStore()
        self.backends = backends if isinstance(backends, Backends) else Backends(backends)
        self._template_backends: dict[str, tuple] = {}  # template id -> (executor, reconstructor, BackendsRan)
        self._stack_compute: dict[tuple[str, str], ComputeProfile] = {}  # (template id, executor) -> its compute
        self._states: dict[str, TemplateState] = {}
        self._encodings: dict[str, StreamEncoding] = {}  # parsed headers, by file id
        self._pending: dict[str, float] = {}  # file id -> when its header (published before its prices) was read
        self._reference_kv = Remembered(reference_caches)  # exact FP16 caches, by template id
        self._outputs = Remembered(64)  # request-keyed outputs (bench sweeps)
        self._lock = threading.RLock()

    def knows(self, template) -> bool:
        return template.id in self._states

    def template_state(self, template, source=None, on_status: StatusSink | None = None) -> TemplateState:
        """Load the model, read the FP16 header, calibrate compute (each once per template)."""
        with self._lock:
            if template.id in self._states:
                return self._states[template.id]
            say = on_status or (lambda stage, msg: None)
            say("loading_model", f"loading the model for {template.id}")
            model = model_for(template, self.model_path)
            fid = file_id(template.id, "fp16")
            header = self._read_header(source or self.source, fid, template.id)
            fp16 = Fp16Info.from_bytes(header)
            compute = self.calibration.get(model, template, fp16.shards)
            if compute is None:
                say("calibrating", f"measuring device compute for {template.id} (first edit of this template only)")
                compute = self.calibration.measure(model, template, fp16.shards)
            state = TemplateState(template, model, fp16, compute, {fid: header})
            self._states[template.id] = state
            return state

    def backends_for(self, state: TemplateState, on_status: StatusSink | None = None) -> tuple:
        """(executor or None, reconstructor or None, :class:`BackendsRan`) of a template on this device. The
        first call per template exports (or loads) its shard programs, with progress on ``on_status``."""
        with self._lock:
            if state.template.id not in self._template_backends:
                tpl, model = state.template, state.model
                shard_size = state.compute.shards[0][2] - state.compute.shards[0][1]
                example = edit_request(tpl, tpl.eval_requests[0] if tpl.eval_requests else None,
                                       resolution=model.codec.resolution, ref_size=model.codec.ref_size)
                self._template_backends[tpl.id] = self.backends.for_model(model, shard_size, example, on_status)
            return self._template_backends[state.template.id]

    def compute_for(self, state: TemplateState, executor, on_status: StatusSink | None = None) -> ComputeProfile:
        """The template's compute as ``executor`` runs it: the eager calibration, or for this device's
        exported programs their own shard times (calibrated once per template, as the eager ones are)."""
        if executor is None:
            return state.compute
        tpl = state.template
        stack = executor.name + ("-partial" if getattr(executor, "offload", None) is not None else "")
        with self._lock:
            if (tpl.id, stack) not in self._stack_compute:
                compute = self.calibration.get(state.model, tpl, state.compute.shards, stack)
                if compute is None:
                    if on_status:
                        on_status("calibrating", f"measuring {tpl.id}'s shard programs ({stack})")
                    compute = self.calibration.measure_stack(state.model, tpl, executor, stack, state.compute)
                self._stack_compute[(tpl.id, stack)] = compute
            return self._stack_compute[(tpl.id, stack)]

    def header(self, state: TemplateState, format_name: str, source=None) -> bytes:
        fid = file_id(state.template.id, format_name)
        with self._lock:
            if fid not in state.headers:
                state.headers[fid] = self._read_header(source or self.source, fid, state.template.id)
            return state.headers[fid]

    def encoding(self, state: TemplateState, format_name: str, source=None) -> StreamEncoding:
        """A fresh per-edit view of the stored file's stream encoding (its header parsed once; one published
        before its prices is read again, at most every ``PENDING_PRICES_REREAD_S``, until they are there)."""
        fid = file_id(state.template.id, format_name)
        with self._lock:
            read_at = self._pending.get(fid)
            if read_at is not None and time.monotonic() - read_at >= PENDING_PRICES_REREAD_S:
                state.headers.pop(fid, None)  # (priced in place: every chunk where it was, no edit's bytes move)
                self._encodings.pop(fid, None)
                del self._pending[fid]
            if fid not in self._encodings:
                encoding = encoding_from_header(format_name, self.header(state, format_name, source))
                self._encodings[fid] = encoding
                if encoding.prices_pending:
                    self._pending[fid] = time.monotonic()
            return self._encodings[fid].fresh()

    def rebuild_prior(self, encoding: StreamEncoding, fid: str, source, on_status: StatusSink | None = None) -> float:
        """The device's rebuild rate (seconds per unit of work) for ``encoding``'s stored file ``fid`` on its
        reconstructor: from the calibration, else timed now on a sample of its levels (once per file and
        reconstructor; 0 for a file whose levels model no work)."""
        reconstructor = getattr(encoding, "reconstructor", None)  # (None: the format's own decode)
        key = fid if reconstructor is None else f"{fid}@{reconstructor.name}"
        with self._lock:
            rate = self.calibration.rebuild_rate(key)
            if rate is None:
                if on_status:
                    on_status("calibrating", f"timing {fid}'s rebuilds (first edit of this file only)")
                try:
                    rate = measure_rebuild_rate(encoding, lambda ranges: source.fetch_timed(fid, ranges).parts)
                except (FetchError, StreamError, OSError, ValueError) as e:
                    # (the edit meets the same source or bytes and answers for them; priced free until it times one)
                    log.warning("%s: could not time its rebuilds (%s); rebuilds are priced as the edit times them",
                                fid, e)
                    return 0.0
                if rate is None:
                    return 0.0
                self.calibration.record_rebuild_rate(key, rate)
            return rate

    @staticmethod
    def _read_header(source, fid: str, template_id: str) -> bytes:
        try:
            return source.header_bytes(fid)
        except FetchError as e:
            if e.status == 404:
                raise TemplateUnavailable(f"no packs for {template_id} ({fid}.pack is missing): build them with "
                                          f"`sakura build --templates {template_id}`") from None
            raise

    def reference_kv(self, state: TemplateState, source=None, on_status: StatusSink | None = None) -> KV:
        """The template's exact FP16 cache (template data, read unpaced, a few templates kept)."""
        def fetch() -> KV:
            if on_status:
                on_status("reference_cache", "fetching the FP16 reference cache")
            src = source or self.source
            encoding, fid = self.encoding(state, "fp16", src), file_id(state.template.id, "fp16")
            kv: KV = {}
            for unit in encoding.units:
                level = unit.levels[0]
                kv.update(encoding.decode(unit, level, src.fetch_timed(fid, encoding.ranges(unit, level)).parts))
            return kv

        return self._reference_kv.get(state.template.id, fetch)

    def memo(self, key: tuple | None, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """``compute()``, remembered under ``key`` (None: not remembered). A sweep that runs many
        systems on the same requests computes each request's reference and local output once."""
        return compute() if key is None else self._outputs.get(key, compute)

    def session(self, template, system: str, network: Network, **kw) -> "EditSession":
        return EditSession(self, template, system, network, **kw)


class EditSession:
    """One edit: every choice made once, then run on the real clock or the simulated one."""

    def __init__(self, runtime: DeviceRuntime, template, system: str, network: Network, *, source=None,
                 on_event: EventSink | None = None, on_status: StatusSink | None = None, timeout_s: float = 60.0,
                 executor=None, reconstructor=None, policy: Policy | None = None,
                 encoding: StreamEncoding | None = None, rng: random.Random | None = None,
                 estimator: str = DEFAULT_ESTIMATOR, fallbacks: bool = True,
                 prefetched: Prefetched | None = None, compute: ComputeProfile | None = None) -> None:
        """``source``: where this edit reads template data (default: the runtime's), e.g. an audited
        client. ``policy`` / ``encoding`` / ``estimator`` replace the system's own (ablation variants).
        ``fallbacks``: reuse / local fallbacks bound waiting (False: always wait, the paper's runtime).
        ``prefetched``: this template's units already on the device (fetched when it was picked).
        ``executor`` / ``reconstructor``: None for both takes the device's own (``DeviceRuntime.backends``).
        ``compute``: the per-shard compute the simulated clock replays (default: the calibration's; the
        bench passes the measured times of another executor)."""
        self.runtime, self.template, self.network = runtime, template, network
        self.system: System = get_system(system)
        self.source = source or runtime.source
        self.on_event, self.on_status = on_event, on_status
        self.timeout_s, self.estimator = timeout_s, estimator
        self.fallbacks, self.prefetched = fallbacks, prefetched
        self.fallback_bound_share = BOUND_SHARE  # wait while the edit ends within this share of local's time
        self.state = runtime.template_state(template, self.source, on_status)
        own = executor is None and reconstructor is None
        if own:  # the device's own backends (one factory for every caller)
            executor, reconstructor, self.backends = runtime.backends_for(self.state, on_status)
        else:  # backends handed in by the caller (tests, bench-device)
            self.backends = ran_for(executor, reconstructor)
        if not self.system.streams:  # local and oracle run the eager model (no shard programs, no rebuilds)
            executor = None
            self.backends = eager_only(self.backends, f"{self.system.name} runs the eager model")
        self.executor = executor
        # the compute the plan and the clock check use: calibrated for what runs (a caller's executor: given)
        self.compute_calibrated = compute is None and (own or executor is None)
        self.compute = compute or (runtime.compute_for(self.state, executor, on_status) if own
                                   else self.state.compute)
        self.scale = network_scale(network, self.state)
        start = network.start if network.start is not None else (rng or random).uniform(0.0, network.trace.duration)
        self.start = float(start)
        self.trace = network.trace.scaled(self.scale)
        self.initial_bps = float(self.trace.rate_at(self.start)) * 1e6
        self.policy = self.encoding = self.file_id = None
        self.rebuild_prior_s_per_work = 0.0
        if self.system.streams:
            # an ablation's own encoding may stream another stored file of the template (sakura-v1)
            self.file_id = file_id(template.id, encoding.name if encoding is not None and encoding.name in FORMATS
                                   else self.system.format)
            self.policy = policy or get_policy(self.system.name)
            self.encoding = encoding or runtime.encoding(self.state, self.system.format, self.source)
            if reconstructor is not None:  # this edit's own view: the shared parsed one keeps torch
                self.encoding = copy.copy(self.encoding)
                self.encoding.reconstructor = reconstructor
            # a level may read another stored file's bytes (the ladder's exact rung: the FP16 file's)
            self.source = resolving(self.source, self.file_id, self.encoding)
            if self.encoding.shards != self.compute.shards:
                raise StreamError(f"{self.file_id}: its shard plan does not match the FP16 file's")
            self.rebuild_prior_s_per_work = runtime.rebuild_prior(self.encoding, self.file_id, self.source, on_status)
        self.runner = get_runner(self.system.runner)

    @property
    def model(self) -> DiTAdapter:
        return self.state.model

    def request(self, *, prompt: str = "", reference: np.ndarray | None = None, catalog_request=None) -> EditRequest:
        """The model's request for this template from the user's input (or a catalog request), validated."""
        codec = self.model.codec
        req = edit_request(self.template, catalog_request, prompt=prompt, reference=reference,
                           resolution=codec.resolution, ref_size=codec.ref_size)
        self.model.validate(req)
        return req

    def plan(self) -> dict:
        """Everything chosen before the first byte moves (the ``plan`` event of the device protocol)."""
        c = self.compute
        return {"template_id": self.template.id, "system": self.system.name, "task": self.template.task,
                "shards": [list(s) for s in c.shards],
                "units": [{"unit": u.index, "shard": u.needed_by, "label": u.label} for u in self.encoding.units]
                if self.encoding else [],
                "trace": self.trace_window(), "trace_name": self.network.name, "trace_start": self.start,
                "trace_scale": self.scale,
                "initial_mbps": self.initial_bps / 1e6, "fp16_bytes": self.state.fp16_bytes,
                "stored_bytes": self.encoding.storage_bytes if self.encoding else 0, "timeout_s": self.timeout_s,
                "prefetched": self.prefetched.summary() if self.prefetched else None,
                "backends": self.backends.to_dict(),
                "compute": {"masked_s": c.masked_s, "local_full_s": c.local_full_s, "prelude_s": c.prelude_s,
                            "shard_s": list(c.shard_s)}}

    def trace_window(self, duration: float = PLAN_TRACE_WINDOW_S) -> dict:
        """The scaled link from the edit's start as a step function: ``mbps[i]`` holds from ``t[i]`` to
        ``t[i+1]`` (same length as ``t``: the last value is repeated)."""
        edges, rates = self.trace.steps(self.start, duration)  # may be all zero: an outage is a link too
        mbps = [round(float(x), 3) for x in rates]
        return {"t": [round(float(x), 4) for x in edges], "mbps": mbps + mbps[-1:]}

    def link_model(self) -> LinkModel:
        """The link on the simulated clock: the scaled trace from this edit's start, and the request
        round trip real transfers measured on this device (a default until one has)."""
        overhead = self.runtime.calibration.request_overhead_s
        return LinkModel(self.trace, self.start, DEFAULT_REQUEST_OVERHEAD_S if overhead is None else overhead)

    def prefetch_simulated(self, think_s: float) -> Prefetched:
        """What prefetch on template pick would hold at this edit's start, had the template been picked
        ``think_s`` earlier on the same link (simulated clock); the edit then uses it."""
        def fetch(ranges):
            return self.source.fetch_timed(self.file_id, ranges).parts

        self.prefetched = simulate_prefetch(self.encoding, self.file_id, self.template.id, self.trace, self.start,
                                            think_s, fetch, self.link_model().request_overhead_s)
        return self.prefetched

    def fallback_context(self) -> FallbackContext | None:
        """What the fallback choice knows about this edit (None: fallbacks off). Going local needs the
        eager model (an exported executor runs fixed masked programs)."""
        if not self.fallbacks:
            return None
        n = len(self.compute.shards)
        least, least_error, step_error = [0.0] * n, [None] * n, [None] * n
        held = self.prefetched.units if self.prefetched else {}
        for u in (self.encoding.units if self.encoding else []):
            smallest = held[u.index].level if u.index in held else min(u.levels, key=lambda lv: lv.nbytes)
            if u.index not in held:  # (a prefetched unit needs no transfer: a wait gets at least its level)
                least[u.needed_by] += smallest.nbytes
            least_error[u.needed_by], step_error[u.needed_by] = smallest.error, self.encoding.step_error(u)
        return FallbackContext.for_edit(self.compute, self.model.num_steps, allow_local=self.executor is None,
                                        allow_recompute=self.encoding is None or self.encoding.redecodable,
                                        least_bytes=least, bound_share=self.fallback_bound_share,
                                        least_error=least_error, step_error=step_error)

    def edit(self, edit_input: EditInput, *, clock: str = "real", with_reference: bool = True,
             cancel: threading.Event | None = None, on_output: Callable[[EditReport], None] | None = None,
             **sim_kw) -> EditReport:
        """The whole edit in one call: the model's request from the person's input, the plan (emitted as
        the ``plan`` event before the first byte moves), the run on the ``real`` or ``sim`` clock, and the
        output's FP16 reference and quality (``with_reference``). ``on_output`` gets the report as soon as
        the output exists, before the reference (which is for comparison only: a viewer shows the edit
        without waiting for it). ``cancel``: checked between the stages (a real run also stops at its next
        request when its source says so)."""
        def check() -> None:
            if cancel is not None and cancel.is_set():
                raise EditCancelled("edit cancelled")

        req = self.request(prompt=edit_input.prompt, reference=edit_input.photo,
                           catalog_request=edit_input.catalog_request)
        plan = self.plan()
        if self.on_event is not None:
            self.on_event({"type": "plan", **plan})
        check()
        t0 = time.perf_counter()
        if clock == "real":
            outcome = self.run(req)
        elif clock == "sim":
            outcome = self.simulate(req, request_key=edit_input.key, **sim_kw)
        else:
            raise ValueError(f"clock must be real or sim, got {clock!r}")
        outcome.timeline.extras["backends"] = self.backends.to_dict()
        report = EditReport(req, outcome.image, outcome.timeline, plan, self.summary(outcome),
                            timing={"edit_s": time.perf_counter() - t0})
        check()
        if on_output is not None:
            on_output(report)
        if with_reference:
            t0 = time.perf_counter()
            report.reference = outcome.image if self.system.holds_cache else self.reference(req, edit_input.key)
            report.quality = quality(outcome.image, report.reference, req.mask)
            report.timing["reference_s"] = time.perf_counter() - t0
            check()
        return report

    def run(self, req: EditRequest) -> Outcome:
        """The edit on the real clock: bytes read from the source, paced along the scaled trace. A source
        with replicas (:class:`~sakura.net.failover.FailoverSource`) puts the retries and switches it made
        during the edit in ``timeline.extras["source_events"]`` (``t``: seconds from the edit's start)."""
        self._check_link()
        t0, seen = time.monotonic(), len(getattr(self.source, "events", ()))
        outcome = self.runner.run(self, req)
        events = list(getattr(self.source, "events", ()))[seen:]
        if events:
            outcome.timeline.extras["source_events"] = [
                {"kind": e.kind, "file_id": e.file_id, "source": e.source, "reason": e.reason,
                 "t": round(e.t - t0, 4)} for e in events]
        return outcome

    def _check_link(self) -> None:
        """Fail at once, not after the timeout, when the first shard's cache cannot arrive in time even at
        its smallest levels (e.g. ``fixed:0.001`` with no regime scale): its wait would surely time out."""
        fb = self.fallback_context()
        if self.encoding is None or (fb is not None and fb.allow_local):
            return  # (with the local fallback a dead link costs local generation's time, not a failure)
        least = sum(min(lv.nbytes for lv in u.levels) for u in self.encoding.units if u.needed_by == 0 and u.levels)
        need = self.trace.time_to_send(least, self.start)
        if need > self.timeout_s + self.compute.prelude_s:
            raise StreamError(
                f"the link is too slow for this edit: the first shard's cache at its smallest level "
                f"({least / 1e3:.1f} kB) would take {need:.0f} s on {self.network.name} (×{self.scale:.3g})"
                f" from {self.start:g} s; the wait limit is {self.timeout_s:.0f} s. Use a faster trace, "
                "--trace-scale or --regime paper"
            )

    def simulate(self, req: EditRequest, *, request_key=None, **kw) -> Outcome:
        """The edit on the simulated clock: measured compute, real decodes, the trace integral.
        ``request_key`` names the request, so outputs that do not depend on the link are computed once."""
        return self.runner.simulate(self, req, request_key=request_key, **kw)

    def reference_kv(self) -> KV:
        return self.runtime.reference_kv(self.state, self.source, self.on_status)

    def reference(self, req: EditRequest, request_key=None) -> np.ndarray:
        """The FP16-reference output: the masked edit with the exact FP16 cache."""
        def compute() -> np.ndarray:
            kv = self.reference_kv()
            if self.on_status:
                self.on_status("reference", "computing the FP16-reference output for comparison")
            return self.model.masked_edit(req, lambda step, layer: kv[(step, layer)]).image

        key = None if request_key is None else (self.template.id, "reference", request_key)
        return self.runtime.memo(key, compute)

    def local_output(self, req: EditRequest, request_key=None) -> np.ndarray:
        key = None if request_key is None else (self.template.id, "local", request_key)
        return self.runtime.memo(key, lambda: self.model.full_edit(req).image)

    def quality(self, image: np.ndarray, req: EditRequest, request_key=None) -> dict:
        return quality(image, self.reference(req, request_key), req.mask)

    def summary(self, outcome: Outcome) -> dict:
        """The timeline's summary with where the time went, for results and reports."""
        tl = outcome.timeline
        xfer, hidden, exposed = tl.transfer_split()
        compute_s = self.compute.local_full_s if self.system.runs_locally else self.compute.masked_s
        # (only against a calibration of what ran: a caller's own executor with the eager times is not checked)
        check = ComputeCheck.of(tl, self.compute, self.system.runs_locally) if self.compute_calibrated else None
        return {**tl.summary(), "backends": self.backends.to_dict(), "fp16_bytes": self.state.fp16_bytes,
                "transfer_s": xfer,
                "transfer_hidden_s": hidden, "transfer_exposed_s": exposed, "compute_s": compute_s,
                "compute_check": check.to_dict() if check is not None else None,
                "trace_scale": self.scale, "trace_start": self.start}
