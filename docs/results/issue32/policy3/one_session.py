"""One bench edit's session, as `sakura bench` prepares it (workload, template, scaled trace, calibration, packs):
shared by this folder's per-edit scripts."""

import argparse
from pathlib import Path

import torch

from sakura.eval.bench import BenchConfig, regime_scales, workload_benches
from sakura.net.traces import load_trace
from sakura.places import default_packs
from sakura.runtime.session import Network


def edit_arguments(*required: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    for name in ("workload", "template", "trace", "calibration", *required):
        ap.add_argument(f"--{name}", required=True)
    ap.add_argument("--request", type=int, required=True)
    ap.add_argument("--start", type=float, required=True)
    ap.add_argument("--packs", default=None)
    return ap


def prepared(a: argparse.Namespace):
    """(the template's bench preparation, the trace scaled to the paper's regime for it)."""
    torch.set_num_threads(1)
    cfg = BenchConfig(workloads=(a.workload,), systems=("sakura",), trace=a.trace,
                      packs=Path(a.packs) if a.packs else default_packs(), calibration_file=Path(a.calibration))
    p = {t.template.id: t for t in workload_benches(a.workload, cfg, {}, print)}[a.template]
    base = load_trace(a.trace)
    return p, base.scaled(regime_scales([p], base, cfg)[a.template])


def session_at(p, scaled, start: float, policy=None):
    """A SAKURA session at ``start`` s of the scaled trace (``policy``: another policy over the same runtime)."""
    return p.session("sakura", Network(scaled, scaled.name, start, scale=1.0), policy=policy)
