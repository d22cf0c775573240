"""Offline, per template (server side): capture, profile importance, write every stored format.

Every format of :data:`sakura.formats.FORMATS` is written to ``PACKDIR/<file id>.pack``:
``<id>.pack`` is SAKURA's progressive pack; ``<id>.fp16.pack``, ``<id>.intq.pack`` and
``<id>.cachegen.pack`` hold the baselines in the same container; ``<id>.build.json`` records what
was built. Token importance goes to ``<id>.importance.safetensors`` for reports only: it is never
in a served file (the server serves ``*.pack`` files only).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.torch import load_file, save_file

from sakura.editing import edit_request, model_for
from sakura.formats import FORMATS
from sakura.kvcache import KVCache
from sakura.model import DiTAdapter, EditRequest
from sakura.offline.compress import compress_cache

DEFAULT_SHARD_SIZE = 2
DEFAULT_MAX_RANK = 128
DEFAULT_LAYOUT = "allocated"  # pack v2 (issue #18); "uniform" writes v1 (the Fig. 8/13/15 comparisons)
BASES = ("shard", "unit")  # v2: one token basis per shard (shared by its K/V units), or one per unit
DEFAULT_BASIS = "shard"


def pack_options(max_rank: int, layout: str = DEFAULT_LAYOUT, basis: str = DEFAULT_BASIS) -> dict:
    """compress_cache options for a pack of top quality ``(max_rank, 8, 8)``: v1 stores exactly that;
    v2 factorises to twice the rank and its allocation stops at that quality (often cheaper with more,
    coarser components than with 8-bit ones: KVTC's finding), by default with one token basis per shard."""
    if basis not in BASES:
        raise ValueError(f"basis must be one of {', '.join(BASES)}, got {basis!r}")
    if layout == "allocated":  # a shared basis serves 2·shard_size units: give it room for their components
        return {"layout": layout, "max_rank": (4 if basis == "shard" else 2) * max_rank, "reference_rank": max_rank,
                "shared_basis": basis == "shard"}
    return {"layout": layout, "max_rank": max_rank}


@dataclass
class BuildReport:
    template_id: str
    model_id: str
    q: float
    max_rank: int
    shard_size: int
    fp16_bytes: int
    storage: dict[str, int]  # format name -> bytes on disk
    seconds: dict[str, float]
    num_reused: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def capture_request(template, model: DiTAdapter) -> EditRequest:
    """The template's own conditioning: what its cache is captured under."""
    first = template.profile_requests[0] if template.profile_requests else None
    req = edit_request(template, first, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    return model.self_conditioned(req)


def profile_importance(model: DiTAdapter, template, cache: KVCache, requests=None) -> dict[tuple[int, int], torch.Tensor]:
    """s_j = Σ_requests Σ_heads Σ_masked-queries a_ij² per (step, layer), from masked runs on the exact cache."""
    total: dict[tuple[int, int], torch.Tensor] = {}
    for r in requests if requests is not None else template.profile_requests:
        req = edit_request(template, r, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
        probe = model.masked_edit(req, cache.provider(), probe=True).importance
        for key, s in probe.items():
            total[key] = total.get(key, 0) + s
    return total


def build_template(template, out_dir: str | Path, *, q: float = 0.5, max_rank: int = DEFAULT_MAX_RANK,
                   shard_size: int = DEFAULT_SHARD_SIZE, model_path: str | Path | None = None,
                   encodings: tuple[str, ...] = tuple(FORMATS), layout: str = DEFAULT_LAYOUT,
                   basis: str = DEFAULT_BASIS, progress: Callable[[str], None] | None = None) -> BuildReport:
    """Capture the template's cache, profile its importance and write each format named in ``encodings``."""
    say = progress or (lambda msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model_for(template, model_path)
    ids = {"model_id": model.model_id, "template_id": template.id}
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    say("capture")
    cache = model.capture(capture_request(template, model)).to(torch.float16)
    seconds["capture"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say("importance")
    importance = profile_importance(model, template, cache)
    save_file({f"{s}.{l}": v.contiguous() for (s, l), v in importance.items()},
              str(out / f"{template.id}.importance.safetensors"))
    seconds["importance"] = time.perf_counter() - t0

    storage = {}
    for fmt in (FORMATS[name] for name in encodings):
        t0 = time.perf_counter()
        say(fmt.name)
        path = out / f"{fmt.file_id(template.id)}.pack"
        if fmt.from_factors:  # the format stores what the offline compression computes, not the cache
            fmt.write(path, compress_cache(cache, importance, q=q, shard_size=shard_size,
                                           **pack_options(max_rank, fmt.layout or layout, basis)), **ids)
        else:
            fmt.write(path, cache, shard_size=shard_size, **ids)
        storage[fmt.name] = path.stat().st_size
        seconds[fmt.name] = time.perf_counter() - t0
    report = BuildReport(template.id, model.model_id, q, max_rank, shard_size, cache.nbytes(), storage,
                         {k: round(v, 3) for k, v in seconds.items()}, cache.num_reused)
    (out / f"{template.id}.build.json").write_text(report.to_json())
    return report


def build_with_progress(templates, out_dir: str | Path, **kw) -> list[BuildReport]:
    """``build_template`` for each template, under one rich progress bar (CLI and demo)."""
    encodings = kw.get("encodings", tuple(FORMATS))
    steps = 2 + len(encodings)  # capture, importance, then one per stored format
    reports = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task("build", total=len(templates) * steps)
        for tpl in templates:
            def say(stage: str, tpl=tpl) -> None:
                bar.update(task, description=f"{tpl.id}: {stage}", advance=0 if stage == "capture" else 1)

            report = build_template(tpl, out_dir, progress=say, **kw)
            bar.advance(task)
            bar.console.print(f"{tpl.id}: FP16 {report.fp16_bytes / 1e6:.1f} MB, SAKURA {report.storage['sakura'] / 1e6:.1f} MB "
                              f"({report.fp16_bytes / report.storage['sakura']:.2f}x smaller)")
            reports.append(report)
    return reports


def load_importance(pack_dir: str | Path, template_id: str) -> dict[tuple[int, int], torch.Tensor]:
    raw = load_file(str(Path(pack_dir) / f"{template_id}.importance.safetensors"))
    return {tuple(int(x) for x in k.split(".")): v for k, v in raw.items()}
