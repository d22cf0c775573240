"""`sakura edit --stream`: one real streamed edit through a template server, with its timeline."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import typer

from sakura.net.client import RangeClient
from sakura.net.shaping import RateSpec
from sakura.net.traces import load_trace, paper_regime_scale
from sakura.online.encodings import encoding_from_header
from sakura.online.policies import get_policy
from sakura.runtime.compute import measure_compute, zero_cache
from sakura.runtime.stream import StreamedEdit, read_header
from sakura.server.run import start_server

DEFAULT_PACKS = Path("packs")


@contextlib.contextmanager
def server_for(packs: Path, url: str | None):
    """Use the server at ``url``, or run one on ``packs`` in its own process for the duration."""
    if url:
        yield url.rstrip("/")
        return
    with start_server(packs, port=0, process=True) as srv:
        yield srv.url


def ensure_packs(packs: Path, template, model_path=None) -> None:
    from sakura.offline.builder import build_template, file_id

    if not (packs / f"{file_id(template.id, 'sakura')}.pack").exists():
        typer.echo(f"building packs for {template.id} into {packs} (first time only)…", err=True)
        build_template(template, packs, model_path=model_path, progress=lambda s: typer.echo(f"  {s}", err=True))


def stream_edit(*, template: str, reference, prompt, out: Path, as_json: bool, catalog=None, policy: str = "sakura",
                trace: str = "5g", start: float = 0.0, trace_scale: float | None = None, regime: str = "paper",
                server: str | None = None, packs: Path = DEFAULT_PACKS, shard_size: int | None = None,
                executor: str = "eager", reconstructor: str = "torch") -> dict:
    from PIL import Image

    from sakura.catalog import load_catalog, load_image_spec
    from sakura.editing import edit_request, model_for
    from sakura.offline.builder import file_id

    tpl = load_catalog(catalog).get(template)
    model = model_for(tpl)
    ref = load_image_spec(reference, Path.cwd()) if reference and tpl.task in ("fs", "vton") else None
    req = edit_request(tpl, prompt=prompt, reference=ref, resolution=model.codec.resolution,
                       ref_size=model.codec.ref_size)
    model.validate(req)
    pol = get_policy(policy)
    ensure_packs(packs, tpl)
    with server_for(packs, server) as base:
        probe_link = RangeClient(base)
        fp16_header = read_header(probe_link, file_id(tpl.id, "fp16"))
        from sakura.offline.fp16 import Fp16Info

        fp16 = Fp16Info.from_bytes(fp16_header)
        shards = fp16.shards
        compute = measure_compute(model, req, zero_cache(model, req), shards[0][2] - shards[0][1], repeats=2)
        base_trace = load_trace(trace)
        scale = trace_scale or (paper_regime_scale(base_trace, fp16.storage_bytes, compute.local_full_s)
                                if regime == "paper" else 1.0)
        report: dict = {"template": tpl.id, "policy": policy, "trace": trace, "start": start, "trace_scale": scale,
                        "server": base, "masked_compute_s": compute.masked_s, "local_full_s": compute.local_full_s}
        if not pol.streams:
            if policy == "local":
                res = model.full_edit(req)
            else:  # oracle: the whole FP16 cache is already on the device (fetched before, untimed)
                enc = encoding_from_header("fp16", fp16_header)
                kv = {}
                for u in enc.units:
                    kv.update(enc.decode(u, u.levels[0], probe_link.fetch(file_id(tpl.id, "fp16"), enc.ranges(u, u.levels[0]))))
                res = model.masked_edit(req, lambda s, l: kv[(s, l)])
            report.update(latency_s=res.seconds, bytes=0, stall_s=0.0)
            image = res.image
        else:
            link = RangeClient(base, rate=RateSpec(trace, start, scale))
            fid = file_id(tpl.id, pol.encoding)
            enc = encoding_from_header(pol.encoding, read_header(link, fid))
            if pol.encoding == "sakura" and reconstructor != "torch":
                from sakura.runtime.reconstruct import get_reconstructor

                enc.reconstructor = get_reconstructor(reconstructor)
            runner = None
            if executor != "eager":
                from sakura.runtime.executors import get_executor

                runner = get_executor(executor, model)
            link.reset_link()
            initial = float(base_trace.scaled(scale).rate_at(start)) * 1e6
            res, tl = StreamedEdit(model, enc, pol, link, fid, compute, initial, executor=runner).run(req)
            report.update(executor=executor, reconstructor=reconstructor)
            image = res.image
            report.update(tl.summary())
            report["timeline"] = tl.to_dict() if as_json else None
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray((np.clip(image, 0, 1) * 255).round().astype("uint8")).save(out)
    report["out"] = str(out)
    if as_json:
        typer.echo(json.dumps(report, indent=1, default=float))
    else:
        _print_summary(report)
    return report


def _print_summary(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console()
    c.print(f"[bold]{report['policy']}[/] on {report['trace']} (×{report['trace_scale']:.3g}, start {report['start']} s): "
            f"latency {report['latency_s']:.3f} s, stall {report.get('stall_s', 0):.3f} s, "
            f"{report.get('bytes', 0) / 1e6:.2f} MB → {report['out']}")
    levels = report.get("levels") or []
    if levels:
        table = Table("unit", "level")
        for i, lv in enumerate(levels):
            table.add_row(str(i), lv)
        c.print(table)
