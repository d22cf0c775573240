"""`sakura bench`: every system over the same trace offsets, the same link model and the same metrics.

For each workload (a task on one model) it samples start offsets in the trace; at each offset it
runs one held-out edit request (round robin over the workload's templates and requests) with
every system. Streaming systems run on the simulated clock by default (replaying measured compute
and real decodes) or on the real clock against a template server; quality is always the image
produced by the received cache vs the image produced with the exact FP16 cache.
"""

from __future__ import annotations

import functools
import json
import resource
import statistics
import time
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request
from sakura.eval.round_trips import measure_round_trips
from sakura.eval.summary_stats import edit_key, fallback_stats, paired_over_oracle, summarize  # noqa: F401
from sakura.formats import PackFormatError, file_id
from sakura.formats.pack import PackInfo
from sakura.kvcache import KVCache
from sakura.net.folder import FolderSource
from sakura.net.stores import is_store_url, open_store
from sakura.net.traces import Trace, TraceError, load_trace
from sakura.offline.builder import DEFAULT_BASIS, DEFAULT_LAYOUT, build_template, template_lock
from sakura.offline.publish import BuildSettings, build_into_store
from sakura.online.monitor import DEFAULT_ESTIMATOR
from sakura.places import default_packs
from sakura.runtime.backends import BackendChoice, programs_beside
from sakura.runtime.calibration import SPREAD_BOUND, CalibrationStore, spread
from sakura.runtime.session import DeviceRuntime, EditInput, EditReport, Network, network_scale
from sakura.systems import OURS, STREAMING, SYSTEMS

WORKLOADS = {"fs": ("fs", "sakura-tiny"), "vton": ("vton", "sakura-tiny"), "mb": ("mb", "sakura-tiny"),
             "mb-sd": ("mb", "sakura-tiny-sd3")}


def workload_templates(catalog, workload: str) -> list:
    if workload not in WORKLOADS:
        raise KeyError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    task, model = WORKLOADS[workload]
    found = catalog.filter(task=task, model=model)
    if not found:
        raise KeyError(f"the catalog has no {task} template for {model} (workload {workload})")
    return found


class TemplateBench:
    """One template as the harness sees it: a device runtime reading the pack folder in-process, the
    template's state in it (model, headers, calibrated compute), and its evaluation requests."""

    def __init__(self, template, packs: Path | str, calibration: CalibrationStore):
        self.template = template
        if is_store_url(packs):  # an object store: the device reads its ranges straight from it
            store = open_store(packs)
            self.packs, source, size = packs, store.source(), store.size
        else:
            self.packs = Path(packs)
            source, size = FolderSource(self.packs), lambda fid: (self.packs / f"{fid}.pack").stat().st_size
        self.runtime = DeviceRuntime(source, calibration=calibration, reference_caches=1)
        self.state = self.runtime.template_state(template)
        self.model, self.compute, self.fp16_bytes = self.state.model, self.state.compute, self.state.fp16_bytes
        self.storage = {name: size(file_id(template.id, SYSTEMS[name].format)) for name in STREAMING}

    def header(self, format_name: str) -> bytes:
        return self.runtime.header(self.state, format_name)

    @property
    def fp16_kv(self) -> dict:
        return self.runtime.reference_kv(self.state)

    def request(self, i: int):
        tpl, m = self.template, self.model
        return edit_request(tpl, tpl.eval_requests[i], resolution=m.codec.resolution, ref_size=m.codec.ref_size)

    def session(self, system: str, network: Network, **kw):
        return self.runtime.session(self.template, system, network, **kw)

    @cached_property
    def _reference_session(self):
        return self.session("oracle", Network(Trace.constant(1.0), "none", 0.0, 1.0))

    def reference(self, i: int) -> np.ndarray:
        """The FP16-cache output of evaluation request ``i`` (computed once)."""
        return self._reference_session.reference(self.request(i), request_key=i)

    def fp16_cache(self) -> KVCache:
        """The exact FP16 cache as a KVCache (for profiling and re-packing)."""
        m = self.model
        reuse = torch.nonzero(~m.token_mask(self.request(0).mask)).flatten()
        cache = KVCache(m.num_steps, m.num_layers, m.heads, m.head_dim, reuse)
        for key, (k, v) in self.fp16_kv.items():
            cache.k[key], cache.v[key] = k, v
        return cache


def current_pack(path: Path) -> bool:
    """Whether a built pack exists in the layout the builder writes now: a pack of an older version, one
    built without the ``auto`` basis check (its build report says which basis it kept) or an unreadable
    one is rebuilt, never streamed as if it were current."""
    try:
        info = PackInfo.open(path)[1]
        report = json.loads(path.with_name(f"{info.template_id}.build.json").read_text())
    except (OSError, ValueError, PackFormatError):
        return False
    if DEFAULT_LAYOUT != "allocated":
        return info.version == 1
    return info.version == 3 and (DEFAULT_BASIS != "auto" or report.get("top_basis") is not None)


def prepare_template(tpl, packs: Path, max_rank: int = 128, q: float = 0.5, say: Callable[[str], None] = print,
                     repeats: int = 3, calibration: CalibrationStore | None = None) -> TemplateBench:
    if is_store_url(packs):
        store = open_store(packs, create=True)
        if store.published_key(tpl.id) is None:
            say(f"building packs for {tpl.id} into {packs}")
            build_into_store(tpl, store, BuildSettings(q=q, max_rank=max_rank))
        say(f"{tpl.id}: device compute from the calibration (measured now if it has none)")
        return TemplateBench(tpl, packs, calibration or CalibrationStore(repeats=repeats))
    packs = Path(packs)
    with template_lock(packs, tpl.id):  # (checked again under the lock: another process may be building it)
        if not current_pack(packs / f"{file_id(tpl.id, 'sakura')}.pack"):
            say(f"building packs for {tpl.id}")
            build_template(tpl, packs, max_rank=max_rank, q=q)
    say(f"{tpl.id}: device compute from the calibration (measured now if it has none)")
    return TemplateBench(tpl, packs, calibration or CalibrationStore(repeats=repeats))


def edit_input(prepared: TemplateBench, req_index: int) -> EditInput:
    """Evaluation request ``req_index`` of the template, named by its index (its reference is computed once)."""
    return EditInput(catalog_request=prepared.template.eval_requests[req_index], key=req_index)


def record(prepared: TemplateBench, req_index: int, system: str, start: float, report: EditReport) -> dict:
    """One sweep row: the timeline's summary and the output's quality vs the FP16-cache output."""
    tl = report.timeline
    return {"template": prepared.template.id, "request": req_index, "system": system, "start_s": start,
            "latency_s": tl.latency_s, "stall_s": tl.stall_s, "bytes": tl.bytes_total,
            "deadline_misses": tl.deadline_misses, "shards": len(tl.shards),
            "startup_s": tl.shards[0].exec_start_t if tl.shards else None,  # (when shard 0 started: the start-up wait)
            "peak_cache_bytes": tl.peak_cache_bytes, "levels": [u.level for u in tl.units], "cuts": tl.cuts,
            "rungs": [u.rung for u in tl.units], "units": len(tl.units), "fallbacks": tl.fallback_counts(),
            "prefetched_bytes": (tl.extras.get("prefetched") or {}).get("bytes", 0),
            "backends": (report.summary.get("backends") or {}).get("label"), **report.quality}


# What a rebuild on the simulated clock is timed with. ``wall``: elapsed time (a quiet machine); ``cpu``:
# the rebuilding thread's CPU time — what it costs with a core to itself, so a sweep run beside other
# work on a shared machine is not charged for their load (compute is replayed from the calibration).
class TickClock:
    """A clock that advances ``tick_s`` per reading, so every timed rebuild costs exactly one tick: runs
    repeat to the bit (the before/after check of a refactor), at the price of ignoring real decode cost."""

    def __init__(self, tick_s: float = 0.002):
        self.tick_s, self.ticks = tick_s, 0

    def __call__(self) -> float:
        self.ticks += 1
        return self.ticks * self.tick_s


REBUILD_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time,
                                                  "tick": TickClock()}
REBUILD_CLOCK_NOTES = {"wall": "elapsed time: with other work on the machine the systems' ranking moves; "
                               "--rebuild-clock cpu does not",
                       "cpu": "the rebuilding thread's CPU time: load-independent",
                       "tick": "every rebuild 2 ms: runs repeat exactly, real decode cost is ignored"}
rebuild_clock = "cpu"  # load-independent (issue #32: with "wall" the ranking moved with machine load)


def use_rebuild_clock(name: str) -> None:
    """Time every simulated rebuild of this process with ``name`` (a key of ``REBUILD_CLOCKS``)."""
    global rebuild_clock
    if name not in REBUILD_CLOCKS:
        raise ValueError(f"unknown rebuild clock {name!r}; choose from {', '.join(REBUILD_CLOCKS)}")
    rebuild_clock = name


def run_one(prepared: TemplateBench, req_index: int, system: str, trace: Trace, start: float, *, policy=None,
            encoding=None, timer: Callable[[], float] | None = None, estimator: str = DEFAULT_ESTIMATOR,
            name: str | None = None, fallbacks: bool = True, anytime: bool = True,
            think_s: float | None = None, regret_budget_s: float | None = None,
            say: Callable[[str], None] = print, rebuild_overlap: float = 1.0, unpaced: bool = False,
            measured_compute: dict | None = None) -> dict:
    """One edit of one system at one offset of an (already scaled) trace on the simulated clock, with
    its quality: an edit session, as the device runs it.

    ``policy`` / ``encoding`` / ``estimator`` replace the system's own, ``fallbacks`` / ``anytime`` turn
    the runtime's off (ablation variants, recorded as ``name``); ``timer`` is the clock the rebuilds
    are measured on (default: the process's rebuild clock, :func:`use_rebuild_clock`). ``think_s``: the
    template was picked that long before the edit, and the device prefetched its pack meanwhile
    (``sakura+prefetch``). ``regret_budget_s``: also measure the edit against its system's clairvoyant
    optimum (:mod:`sakura.eval.regret`; the planner's time budget per solve), in the record's ``regret``.
    ``rebuild_overlap``: the share of a rebuild's time the device hides beside execution (:func:`simulate`);
    ``unpaced``: the link as the device reads a kernel-shaped one (:class:`~sakura.runtime.sim.LinkModel`);
    ``measured_compute``: a real run's ``compute`` (its record's): executed in place of the calibrated compute."""
    session = prepared.session(system, Network(trace, trace.name, start, scale=1.0), policy=policy, encoding=encoding,
                               estimator=estimator, fallbacks=fallbacks)
    if think_s:
        session.prefetch_simulated(think_s)
    kw = {"rebuild_overlap": rebuild_overlap, "unpaced": unpaced, **({} if anytime else {"anytime": False})}
    if measured_compute is not None:
        kw["replay"] = replace(session.compute, prelude_s=measured_compute["prelude_s"],
                               shard_s=measured_compute["shard_s"])
    report = session.edit(edit_input(prepared, req_index), clock="sim", timer=timer or REBUILD_CLOCKS[rebuild_clock],
                          **kw)
    row = record(prepared, req_index, name or (policy.name if policy else system), start, report)
    row["outage_s"] = trace.dead_seconds(start, row["latency_s"])
    if regret_budget_s is not None and session.encoding is not None and not think_s:
        from sakura.eval.regret import edit_regret, format_inputs  # (the planner: only when asked for)

        inputs = format_inputs(prepared, SYSTEMS[system].format, say)
        row["regret"] = edit_regret(session, report.request, req_index, report.timeline, report.quality["psnr_masked"],
                                    inputs, fallbacks, regret_budget_s).to_dict()
    return row


def workload_benches(workload: str, cfg: "BenchConfig", cache: dict, say: Callable[[str], None]) -> list[TemplateBench]:
    """The prepared templates of a workload, prepared once per process (``cache`` by template id)."""
    out = []
    for tpl in workload_templates(load_catalog(), workload):
        if tpl.id not in cache:
            cache[tpl.id] = prepare_template(tpl, cfg.packs, cfg.max_rank, say=say, calibration=cfg.calibration)
        out.append(cache[tpl.id])
    return out


def offset_plan(prepared_all: list[TemplateBench], starts) -> Iterator[tuple[TemplateBench, int, float]]:
    """Round robin over templates, then over their held-out requests: one edit per start offset."""
    for k, start in enumerate(starts):
        prepared = prepared_all[k % len(prepared_all)]
        yield prepared, (k // len(prepared_all)) % len(prepared.template.eval_requests), float(start)


TRACE_PARTS = ("all", "first", "second", "outages")
OUTAGE_LEAD_S = 1.0  # (outages) an edit starts up to this long before a dead stretch, so it runs into it


def start_offsets(rng: np.random.Generator, trace: Trace, cfg: "BenchConfig") -> np.ndarray:
    """``cfg.starts`` uniform start offsets in the trace's part ``cfg.trace_part``: a policy is tuned on first
    halves and reported on second halves (an edit that starts near the end runs on into the trace's repeat).
    ``outages``: each offset up to ``OUTAGE_LEAD_S`` before one of the trace's dead stretches, round robin
    over them — the edits a link model is judged on (issue #35)."""
    if cfg.trace_part == "outages":
        begins = [z0 for z0, _ in trace.dead_stretches()]
        if not begins:
            raise TraceError(f"trace {trace.name} has no dead stretch to start edits before")
        lead = rng.uniform(0.0, OUTAGE_LEAD_S, size=cfg.starts)
        return np.array([(begins[k % len(begins)] - lead[k]) % trace.duration for k in range(cfg.starts)])
    lo, hi = {"all": (0.0, 1.0), "first": (0.0, 0.5), "second": (0.5, 1.0)}[cfg.trace_part]
    return rng.uniform(lo * trace.duration, hi * trace.duration, size=cfg.starts)


def sweep(cfg: "BenchConfig", workload: str, benches: list[TemplateBench], systems_fn, progress, label: str,
          trace_spec: str | None = None) -> list[dict]:
    """The sweep every figure runs: ``systems_fn(prepared, req_index, trace, start) -> list[record]`` at
    ``cfg.starts`` offsets of the trace (``trace_spec``, default the config's), scaled per template by
    the config's regime; each record is tagged with ``workload``."""
    base = load_trace(trace_spec or cfg.trace)
    starts = start_offsets(np.random.default_rng(cfg.seed), base, cfg)
    scales = regime_scales(benches, base, cfg)
    task = progress.add_task(label, total=cfg.starts) if progress else None
    rows = []
    for prepared, req_index, start in offset_plan(benches, starts):
        for r in systems_fn(prepared, req_index, base.scaled(scales[prepared.template.id]), start):
            r["workload"] = workload
            rows.append(r)
        if progress:
            progress.advance(task)
    return rows


def regime_scale(prepared: TemplateBench, trace: Trace, regime: str, trace_scale: float | None) -> float:
    """The session's own rule (:func:`sakura.runtime.session.network_scale`), once per template."""
    return network_scale(Network(trace, trace.name, 0.0, trace_scale or None, regime), prepared.state)


def regime_scales(prepared_all: list[TemplateBench], trace: Trace, cfg: "BenchConfig") -> dict[str, float]:
    """:func:`regime_scale` of each template, by template id."""
    return {p.template.id: regime_scale(p, trace, cfg.regime, cfg.trace_scale) for p in prepared_all}


def storage_of(prepared_all: list[TemplateBench]) -> dict[str, float]:
    """Mean stored bytes per template for each system's file (FP16 = the raw cache size)."""
    storage = {s: statistics.mean(prepared.storage[s] for prepared in prepared_all) for s in STREAMING}
    storage["fp16"] = statistics.mean(prepared.fp16_bytes for prepared in prepared_all)
    return storage


def regime_block(prepared_all: list[TemplateBench], scales: dict[str, float], base_trace: Trace,
                 trace_name: str) -> dict:
    """Where a workload sits relative to the paper's regime (23 s FP16 transfer vs 13 s local)."""
    fp16_mean = statistics.mean(prepared.fp16_bytes for prepared in prepared_all)
    scale = statistics.mean(scales.values())
    median_bps = base_trace.typical_mbps * 1e6 * scale  # the median, or of the non-zero samples if that is 0
    return {"local_full_s": statistics.mean(prepared.compute.local_full_s for prepared in prepared_all),
            "masked_s": statistics.mean(prepared.compute.masked_s for prepared in prepared_all),
            # per template, then the mean: each template sits in the regime on its own measured compute
            "fp16_transfer_s_at_median": statistics.mean(
                p.fp16_bytes * 8 / (base_trace.typical_mbps * 1e6 * scales[p.template.id]) for p in prepared_all),
            "trace_scale": scale,
            "fp16_cache_bytes": fp16_mean, "trace": trace_name, "trace_median_mbps_scaled": median_bps / 1e6,
            "templates": [prepared.template.id for prepared in prepared_all],
            "mask_ratio": statistics.mean(prepared.template.token_ratio for prepared in prepared_all)}


def device_memory(ws: dict, prepared_all: list[TemplateBench], modelled: bool) -> None:
    """Per system, the device's peak memory: weights + the most cache it held (the harness is one
    process, so this is a model; ``modelled=False``: not reported, see the simulated sweep's)."""
    weights = statistics.mean(sum(p.numel() * p.element_size() for p in prepared.model.transformer.parameters())
                              for prepared in prepared_all)
    for system, s in ws.items():
        if system in SYSTEMS and SYSTEMS[system].holds_cache:  # the whole FP16 cache
            s["device_peak_cache_bytes"] = int(ws["regime"]["fp16_cache_bytes"])
        if system in SYSTEMS:
            s["device_peak_rss_bytes"] = int(weights + s["device_peak_cache_bytes"]) if modelled else None
    ws["regime"]["harness_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class BenchConfig:
    """One benchmark run. ``calibration_file`` keeps the measured compute and link between runs (per
    machine and model weights); None measures in memory for this run only."""

    workloads: tuple[str, ...] = ("fs", "vton", "mb", "mb-sd")
    systems: tuple[str, ...] = tuple(SYSTEMS)
    trace: str = "5g"
    starts: int = 100
    trace_part: str = "all"  # where the offsets come from: all | first | second (held out) | outages
    regime: str = "paper"
    trace_scale: float | None = None
    packs: Path = field(default_factory=default_packs)
    seed: int = 0
    max_rank: int = 128
    append: bool = False  # keep other workloads already in DIR/summary.json (run workloads separately)
    calibration_file: Path | None = None
    think_time: float | None = None  # add `sakura+prefetch` rows: the template was picked this long before the edit
    fallbacks: bool = True  # every streaming system's runtime may reuse / recompute / go local (False: always wait)
    repeats: int = 3  # masked runs per template calibration
    full_repeats: int | None = None  # local-generation runs (default repeats − 1): the regime scale rests on them
    quality_requests: int = 2  # held-out requests per template in the static quality sweep (Fig. 15)
    executor: str = "eager"  # another stack than eager + torch: its rows run beside the eager ones (bench_backends)
    reconstructor: str = "torch"
    regret: bool = False  # measure every streamed edit against its system's clairvoyant optimum (sim clock)
    regret_budget_s: float = 20.0  # the planner's time per solve; past it, it reports its optimality gap
    window_rule: bool = False  # add `sakura+rule` rows: SAKURA with its earlier per-unit window rule (sim clock)
    also_estimators: tuple[str, ...] = ()  # add `sakura+NAME` rows: SAKURA on another rate estimator (sim clock)
    sim_link: str = "fluid"  # the simulated clock's link (SIM_LINKS): "tcp" holds a transfer past an outage
    # the share of a rebuild's time the simulated device hides beside execution: 1, a core to spare (a phone); 0, the
    # executor's core (the 2-core host testbed, whose second core serves the template server and the link)
    rebuild_overlap: float = 1.0

    @property
    def stack(self) -> BackendChoice | None:
        """The device stack to run beside eager + torch (None: only eager + torch)."""
        if (self.executor, self.reconstructor) == ("eager", "torch"):
            return None
        return BackendChoice(self.executor, self.reconstructor, programs_beside(self.packs))

    @cached_property
    def calibration(self) -> CalibrationStore:
        return CalibrationStore(self.calibration_file, repeats=self.repeats, full_repeats=self.full_repeats)

    def to_json(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v) for f in fields(self) for v in [getattr(self, f.name)]}


# One edit of the sweep: (template, request index, system, unscaled trace, scale, start) -> its record.
EditRunner = Callable[[TemplateBench, int, str, Trace, float, float], dict]


# the simulated clock's link: the trace as it is; as TCP sees it through outages; and, as the device reads a
# kernel-shaped link, each request and sub-request paying its round trip once the link is free
SIM_LINKS = ("fluid", "tcp", "kernel")


def simulated_edit(prepared: TemplateBench, req_index: int, system: str, trace: Trace, scale: float,
                   start: float, fallbacks: bool = True, regret_budget_s: float | None = None,
                   say: Callable[[str], None] = print, sim_link: str = "fluid", rebuild_overlap: float = 1.0,
                   measured_compute: dict | None = None) -> dict:
    scaled = trace.scaled(scale)
    if sim_link in ("tcp", "kernel"):  # an outage holds the transfer until TCP's next retransmission (issue #35)
        scaled = scaled.with_retransmission_stalls(since=start)
    return run_one(prepared, req_index, system, scaled, start, fallbacks=fallbacks,
                   regret_budget_s=regret_budget_s if system in STREAMING else None, say=say,
                   rebuild_overlap=rebuild_overlap, unpaced=sim_link == "kernel", measured_compute=measured_compute)


def run_bench(cfg: BenchConfig, out: Path, progress=None, say: Callable[[str], None] = print,
              benches: dict | None = None, run_edit: EditRunner = simulated_edit, clock: str = "sim") -> dict:
    """The main latency/quality sweep. Writes ``records.jsonl`` and ``summary.json``; returns the summary.
    ``run_edit`` runs one edit (default: on the simulated clock; :mod:`sakura.eval.realclock` passes the
    real one); everything else — offsets, templates, requests, summaries — is the same on both clocks."""
    out.mkdir(parents=True, exist_ok=True)
    regret = cfg.regret and clock == "sim"
    if run_edit is simulated_edit:
        run_edit = functools.partial(simulated_edit, fallbacks=cfg.fallbacks,
                                     regret_budget_s=cfg.regret_budget_s if regret else None, say=say,
                                     sim_link=cfg.sim_link, rebuild_overlap=cfg.rebuild_overlap)
    base_trace = load_trace(cfg.trace)
    if base_trace.total_bytes <= 0:
        raise TraceError(f"trace {cfg.trace} is 0 Mbps throughout: no edit can stream on it and there is no rate "
                         "to set the regime from (every system would run locally)")
    rng = np.random.default_rng(cfg.seed)
    summary: dict = {"config": {**cfg.to_json(), "clock": clock, "rebuild_clock": rebuild_clock}, "workloads": {}}
    say(describe_calibration(cfg.calibration))
    say(f"rebuilds timed by the {rebuild_clock} clock ({REBUILD_CLOCK_NOTES[rebuild_clock]})")
    if regret:
        say("regret: every streamed edit is measured against its system's clairvoyant optimum, and SAKURA rerun "
            f"with the true future rates ({PERFECT_NAME})")
    records_path = out / "records.jsonl"
    benches = {} if benches is None else benches
    mode = "w"
    if cfg.append and (out / "summary.json").exists():
        previous = json.loads((out / "summary.json").read_text())
        summary["workloads"] = {w: v for w, v in previous["workloads"].items() if w not in cfg.workloads}
        kept = [line for line in records_path.read_text().splitlines()
                if line.strip() and json.loads(line)["workload"] not in cfg.workloads]
        records_path.write_text("".join(line + "\n" for line in kept))
        mode = "a"
    with records_path.open(mode) as rec_file:
        for workload in cfg.workloads:
            prepared_all = workload_benches(workload, cfg, benches, say)
            if clock == "sim" and cfg.calibration.request_overhead_s is None:
                say("measuring the request round trip against a template server process (once per machine)")
                measure_round_trips(cfg.packs, [p.template.id for p in prepared_all], cfg.calibration)
            scales = regime_scales(prepared_all, base_trace, cfg)
            starts = start_offsets(rng, base_trace, cfg)
            stacks = stack_benches(prepared_all, cfg, benches, say) if clock == "sim" else {}
            records = []
            task = (progress.add_task(f"bench {workload} ({clock} clock)", total=cfg.starts * len(cfg.systems))
                    if progress else None)
            for prepared, req_index, start in offset_plan(prepared_all, starts):
                for system in cfg.systems:
                    rows = [run_edit(prepared, req_index, system, base_trace, scales[prepared.template.id], start)]
                    if system == OURS and cfg.think_time and clock == "sim":  # beside, never instead of
                        rows.append(
                            run_one(
                                prepared,
                                req_index,
                                system,
                                base_trace.scaled(scales[prepared.template.id]),
                                start,
                                think_s=cfg.think_time,
                                name="sakura+prefetch",
                                fallbacks=cfg.fallbacks,
                            )
                        )
                    if system == OURS and cfg.window_rule and clock == "sim":  # beside, never instead of
                        rows.append(window_rule_edit(prepared, req_index, base_trace.scaled(
                            scales[prepared.template.id]), start, cfg, regret, say))
                    for estimator in cfg.also_estimators if system == OURS and clock == "sim" else ():
                        rows.append(run_one(prepared, req_index, OURS, base_trace.scaled(scales[prepared.template.id]),
                                            start, estimator=estimator, name=f"{OURS}+{estimator}",
                                            fallbacks=cfg.fallbacks,
                                            regret_budget_s=cfg.regret_budget_s if regret else None, say=say))
                    if system == OURS and regret:  # the estimator's share of SAKURA's regret
                        rows.append(perfect_prediction_edit(prepared, req_index, base_trace.scaled(
                            scales[prepared.template.id]), start, cfg, say))
                    stack = stacks.get(prepared.template.id)
                    if stack is not None:  # the same edit on the asked stack, beside the eager/torch row
                        rows.append(run_one(stack, req_index, system, base_trace.scaled(scales[prepared.template.id]),
                                            start, name=stack_row_name(system, stack.ran), fallbacks=cfg.fallbacks))
                    for r in rows:
                        r["workload"] = workload
                        records.append(r)
                        rec_file.write(json.dumps(r) + "\n")
                    if progress:
                        progress.advance(task)
            ws = summarize(records, storage_of(prepared_all))
            if regret:
                from sakura.eval.regret import decomposition, regret_stats  # (the planner: only when asked for)

                for system in ws:
                    stats = regret_stats([r for r in records if r["system"] == system])
                    if stats:
                        ws[system]["regret"] = stats
                ws["regret_decomposition"] = decomposition(records, OURS)
            ws["regime"] = regime_block(prepared_all, scales, base_trace, cfg.trace)
            if stacks:
                ws["backends"] = ratio_table(ws, cfg.systems, list(stacks.values()))
            device_memory(ws, prepared_all, modelled=clock == "sim")
            summary["workloads"][workload] = ws
            say(describe_regime(workload, prepared_all, scales))
    summary["calibration"] = cfg.calibration.summary()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


PERFECT_NAME = "sakura+perfect"


def perfect_prediction_edit(prepared: TemplateBench, req_index: int, trace: Trace, start: float, cfg: "BenchConfig",
                            say: Callable[[str], None] = print) -> dict:
    """SAKURA's policy with the true future rates (:class:`sakura.eval.regret.PerfectPrediction`), with its regret."""
    from sakura.eval.regret import PerfectPrediction  # (the planner: only when asked for)
    from sakura.online.policies import get_policy  # (with it: SAKURA's policy rerun on the true rates)

    policy = PerfectPrediction(get_policy(OURS), trace, start, PERFECT_NAME)  # (the trace is scaled already)
    return run_one(prepared, req_index, OURS, trace, start, policy=policy, fallbacks=cfg.fallbacks,
                   regret_budget_s=cfg.regret_budget_s, say=say)


RULE_NAME = "sakura+rule"


def window_rule_edit(prepared: TemplateBench, req_index: int, trace: Trace, start: float, cfg: "BenchConfig",
                     regret: bool, say: Callable[[str], None] = print) -> dict:
    """SAKURA with its earlier per-unit window rule instead of the plan (``RULE_SETTINGS``: each unit its own window,
    the start-up hold one gate lead)."""
    from sakura.online.policies import RULE_SETTINGS, get_policy  # (only with --window-rule: the rule's settings)

    return run_one(prepared, req_index, OURS, trace, start, policy=get_policy(OURS, **RULE_SETTINGS), name=RULE_NAME,
                   fallbacks=cfg.fallbacks, regret_budget_s=cfg.regret_budget_s if regret else None, say=say)


def stack_benches(prepared_all: list[TemplateBench], cfg: BenchConfig, cache: dict,
                  say: Callable[[str], None]) -> dict:
    """The workload's templates on ``cfg.stack`` (programs exported once, costs measured once per process),
    by template id; empty when only eager + torch runs."""
    from sakura.eval.bench_backends import StackBench  # (bench-device's measurement code: only with a stack)

    if cfg.stack is None:
        return {}
    out = {}
    for p in prepared_all:
        key = (p.template.id, cfg.stack.label)
        if key not in cache:
            say(f"{p.template.id}: measuring {cfg.stack.label} beside eager+torch (bench-device's measurements)")
            cache[key] = StackBench(p, cfg.stack, say=say)
            c = cache[key].cost.to_dict()
            say(f"{p.template.id}: ran {cache[key].ran.line()}; execute ×{c['execute_ratio_mean']:.2f}, rebuild "
                f"×{(c['rebuild_ratio_mean'] or 1):.2f} of eager+torch per shard")
        out[p.template.id] = cache[key]
    return out


def stack_row_name(system: str, ran) -> str:
    return f"{system}@{ran.label}"


def ratio_table(ws: dict, systems, stacks: list) -> dict:
    from sakura.eval.bench_backends import ratio_table as table  # (only with a stack)

    return table(ws, systems, stacks)


def describe_calibration(store: CalibrationStore) -> str:
    """Which calibration a run uses: reused from a file, or measured now (and kept where)."""
    m = store.machine
    where = (f"reusing {store.loaded_from}" if store.loaded_from
             else f"measuring now, kept in {store.path}" if store.path else "measuring now, in memory only")
    rt = store.request_overhead_s
    link = (
        f"request round trip {rt * 1e3:.1f} ms (measured)" if rt is not None else "request round trip not measured yet"
    )
    return (
        f"calibration: {where} ({m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} thread(s)); {link}"
    )


def describe_regime(workload: str, prepared_all: list[TemplateBench], scales: dict[str, float]) -> str:
    """Each template's local-generation time (median, spread, runs) and the regime scale it gives."""
    parts = []
    for p in prepared_all:
        xs = p.compute.local_full_samples
        s = spread(xs)
        shown = f"spread {100 * s:.0f}%" if s is not None else "1 run"
        if s is not None and s > SPREAD_BOUND:
            shown += f", ABOVE THE {100 * SPREAD_BOUND:.0f}% BOUND: this run only, not stored"
        load = p.runtime.calibration.busy_load(p.model, p.template)
        if load is not None:
            shown += (f", MEASURED UNDER LOAD {load:.2f} per core: its seconds are that load's (a quiet run "
                      "measures again)")
        parts.append(f"{p.template.id} local {p.compute.local_full_s:.2f} s ({shown}, {len(xs)} runs) → "
                     f"scale {scales[p.template.id]:.4f}")
    return f"{workload}: " + "; ".join(parts)
