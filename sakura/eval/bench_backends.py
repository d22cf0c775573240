"""``sakura bench --executor executorch --reconstructor opencl``: the same sweep on the phone-style stack,
beside the eager/torch rows, in one run.

Per template, :class:`StackBench` is a second device runtime over the same packs and calibration whose
backends are the asked ones (:class:`~sakura.runtime.backends.Backends`, the factory every caller uses).
Its per-shard cost is measured with ``sakura bench-device``'s own code (:func:`measure_execute`,
:func:`measure_rebuild`) on the template's built pack and request, both stacks interleaved in the same
process: the simulated clock then replays the calibrated compute with each shard scaled by its measured
executor ratio, and times the stack's real rebuilds (OpenCL) as it times torch's. Rows are named
``<system>@<executor>+<reconstructor>``; the workload's ``backends`` block has the per-shard times and ratios.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sakura.eval.device_bench import DEFAULT_CONFIGS, measure_execute, measure_rebuild, parse_configs
from sakura.eval.device_bench_report import config_key
from sakura.formats import file_id
from sakura.formats.pack import PackReader
from sakura.runtime.backends import BackendChoice, BackendsRan
from sakura.runtime.compute import ComputeProfile
from sakura.runtime.session import DeviceRuntime


@dataclass
class StackCost:
    """Per-shard milliseconds of both stacks on one template (medians of ``repeats`` runs)."""

    ran: BackendsRan
    execute_ms: dict[str, list[float]] = field(default_factory=dict)  # executor name -> per shard (median)
    rebuild_ms: dict[str, list[float]] = field(default_factory=dict)  # reconstructor name -> per shard (main config)
    main_config: str = ""
    execute_best_ms: dict[str, list[float]] = field(default_factory=dict)  # best of the runs: the ratios use these
    rebuild_best_ms: dict[str, list[float]] = field(default_factory=dict)
    threads: dict = field(default_factory=dict)  # torch intra-op threads and ExecuTorch's pool while measured
    shards: int = 0  # shards of the edit (the ratio is 1 for each when both stacks execute eagerly)

    @property
    def execute_ratio(self) -> list[float]:
        """Per shard, the stack's executor time over eager's (best of the runs: a loaded machine only ever
        adds time, so the best run is the closest to each backend's own cost)."""
        ex = self.execute_best_ms or self.execute_ms
        if self.ran.executor == "eager" or "eager" not in ex:  # the same eager run on both sides (an SD3 model)
            return [1.0] * self.shards
        base, other = ex["eager"], ex[self.ran.executor]
        return [o / b for o, b in zip(other, base)]

    @property
    def rebuild_ratio(self) -> list[float] | None:
        rb = self.rebuild_best_ms or self.rebuild_ms
        if self.ran.reconstructor not in rb or "torch" not in rb:
            return None
        return [o / b for o, b in zip(rb[self.ran.reconstructor], rb["torch"])]

    def to_dict(self) -> dict:
        def mean(xs):
            return round(statistics.mean(xs), 4) if xs else None

        rb, ex = self.rebuild_ms, self.execute_ms
        def rounded(d):
            return {k: [round(x, 4) for x in v] for k, v in d.items()}

        return {"backends": self.ran.to_dict(), "main_config": self.main_config, "threads": self.threads,
                "execute_ms_per_shard": rounded(ex), "rebuild_ms_per_shard": rounded(rb),
                "execute_best_ms_per_shard": rounded(self.execute_best_ms),
                "rebuild_best_ms_per_shard": rounded(self.rebuild_best_ms),
                "execute_ms_mean": {k: mean(v) for k, v in ex.items()},
                "rebuild_ms_mean": {k: mean(v) for k, v in rb.items()},
                "execute_best_ms_mean": {k: mean(v) for k, v in self.execute_best_ms.items()},
                "rebuild_best_ms_mean": {k: mean(v) for k, v in self.rebuild_best_ms.items()},
                "execute_ratio_per_shard": [round(x, 4) for x in self.execute_ratio],
                "execute_ratio_mean": mean(self.execute_ratio),
                "rebuild_ratio_mean": mean(self.rebuild_ratio) if self.rebuild_ratio else None}


class StackBench:
    """A template on the asked stack: quacks like :class:`~sakura.eval.bench.TemplateBench` for ``run_one``."""

    def __init__(self, prepared, choice: BackendChoice, repeats: int = 5, say: Callable[[str], None] = print):
        self.base, self.template = prepared, prepared.template
        self.runtime = DeviceRuntime(prepared.runtime.source, calibration=prepared.runtime.calibration,
                                     reference_caches=1, backends=choice)
        self.state = self.runtime.template_state(prepared.template)
        self.executor, self.reconstructor, self.ran = self.runtime.backends_for(
            self.state, on_status=lambda stage, msg: say(f"{prepared.template.id}: {msg}"))
        self.cost = measure_stack(self, repeats, say)
        c = prepared.compute
        self.compute = ComputeProfile(c.shards, [s * r for s, r in zip(c.shard_s, self.cost.execute_ratio)],
                                      c.prelude_s, c.local_full_s, list(c.local_full_samples))

    @property
    def model(self):
        return self.state.model

    def session(self, system: str, network, **kw):
        return self.runtime.session(self.template, system, network, compute=self.compute, **kw)


def measure_stack(stack: StackBench, repeats: int, say: Callable[[str], None]) -> StackCost:
    """bench-device's measurements on the template's own pack (SAKURA's) and first evaluation request."""
    prepared, ran = stack.base, stack.ran
    model, state = prepared.model, prepared.state
    shard_size = state.compute.shards[0][2] - state.compute.shards[0][1]
    req = prepared.request(0)
    kv = prepared.fp16_kv
    executors = ["eager", ran.executor] if ran.executor != "eager" else []  # eager on both sides: nothing to time

    def make(name: str):
        from sakura.runtime.executors import get_executor  # the eager executor for the baseline column

        return stack.executor if name == ran.executor and stack.executor is not None else get_executor(name, model)

    import torch

    from sakura.runtime.executors.executorch_backend import pool_threads  # (ExecuTorch's pool, when it runs)

    threads = torch.get_num_threads()
    pool = pool_threads() if ran.executor == "executorch" else None  # `sakura bench` sized it to torch's threads
    execute = measure_execute(executors, model, req, shard_size, lambda step, layer: kv[(step, layer)],
                              repeats, say, make=make)
    packs = prepared.packs
    reader = PackReader(Path(packs) / f"{file_id(prepared.template.id, 'sakura')}.pack")
    info = reader.info
    cfgs = parse_configs(DEFAULT_CONFIGS, info.geometry.rank, info.geometry.group)
    key = {(s, c): info.level_for(s, *c) for s in range(info.num_shards) for c in cfgs}
    blobs = {(s, c): reader.read(s, *key[(s, c)]) for s in range(info.num_shards) for c in cfgs}
    names = ["torch"] + ([ran.reconstructor] if ran.reconstructor != "torch" else [])
    rebuild = measure_rebuild(names, info, cfgs, key, blobs, repeats, say)
    main = config_key(cfgs[min(1, len(cfgs) - 1)])
    return StackCost(ran, dict(execute.ms), {n: rebuild.ms[n][main] for n in rebuild.ms}, main,
                     dict(execute.min_ms), {n: rebuild.min_ms[n][main] for n in rebuild.min_ms},
                     {"torch": threads, "executorch_pool": pool}, len(state.compute.shards))


def ratio_table(summary_ws: dict, systems, stacks: list[StackBench]) -> dict:
    """The workload's ``backends`` block: per template the measured per-shard costs, per system the
    stack's p50 / p90 over the eager row's."""
    labels = sorted({s.ran.label for s in stacks})
    rows = {}
    for system in systems:
        for label in labels:
            other = summary_ws.get(f"{system}@{label}")
            base = summary_ws.get(system)
            if other and base:
                rows[f"{system}@{label}"] = {
                    "p50_s": [base["latency_p50_s"], other["latency_p50_s"]],
                    "p90_s": [base["latency_p90_s"], other["latency_p90_s"]],
                    "p50_ratio": other["latency_p50_s"] / base["latency_p50_s"],
                    "p90_ratio": other["latency_p90_s"] / base["latency_p90_s"],
                    "psnr_masked_mean": [base["psnr_masked_mean"], other["psnr_masked_mean"]]}
    return {"stacks": labels, "templates": {s.template.id: s.cost.to_dict() for s in stacks}, "latency": rows}


def backends_markdown(summary: dict) -> str:
    """The side-by-side table of a run with a stack: per workload and system p50 / p90 of eager+torch and of
    the stack (and their ratio), then per template the per-shard execute and rebuild costs and their ratios."""
    lines = ["| workload | system | stack | p50 eager+torch | p50 stack | ratio | p90 eager+torch | p90 stack | ratio "
             "| PSNR mask eager / stack |", "|" + "---|" * 10]
    shards = ["", "Per shard, best of the runs (mean over the edit's shards):", "",
              "| template | stack ran | execute ms/shard eager | execute ms/shard stack | ratio | rebuild ms/shard "
              "torch | rebuild ms/shard stack | ratio | config |", "|" + "---|" * 9]
    for w, ws in summary.get("workloads", {}).items():
        block = ws.get("backends")
        if not block:
            continue
        for name, row in block["latency"].items():
            system, stack = name.split("@", 1)
            lines.append(f"| {w} | {system} | {stack} | {row['p50_s'][0]:.3f} | {row['p50_s'][1]:.3f} | "
                         f"{row['p50_ratio']:.2f}× | {row['p90_s'][0]:.3f} | {row['p90_s'][1]:.3f} | "
                         f"{row['p90_ratio']:.2f}× | {row['psnr_masked_mean'][0]:.1f} / "
                         f"{row['psnr_masked_mean'][1]:.1f} |")
        for tid, c in block["templates"].items():
            b = c["backends"]
            ex = c["execute_best_ms_mean"] or c["execute_ms_mean"]
            rb = c["rebuild_best_ms_mean"] or c["rebuild_ms_mean"]
            note = f" ({b['note']})" if b.get("note") else ""
            rb_ratio = c["rebuild_ratio_mean"]
            eager_ms = f"{ex['eager']:.2f}" if "eager" in ex else "eager, not timed"
            stack_ms = f"{ex[b['executor']]:.2f}" if b["executor"] in ex else eager_ms
            shards.append(f"| {tid} | {b['label']}{note} | {eager_ms} | {stack_ms} "
                          f"| {c['execute_ratio_mean']:.2f}× | {rb['torch']:.2f} | "
                          f"{rb.get(b['reconstructor'], rb['torch']):.2f} | "
                          f"{'—' if rb_ratio is None else f'{rb_ratio:.2f}×'} | {c['main_config']} |")
    return "\n".join(lines + shards) + "\n"
