"""Quality explorer: image quality against the bytes a system sends (the paper's Fig. 15 frontier).

For one template and one of its catalog requests, every point is a real masked edit whose
reusable K/V were rebuilt from exactly the bytes a given configuration would transfer:

* SAKURA — a total byte budget split evenly over the shards; each shard takes the best profiled
  (rank, bits_A, bits_B) of its pack's frontier that fits (the allocator's rule, without a link);
* IntQ — one bit width for the whole edit (each stored width is a point);
* CacheGen — one stored quality level for every chunk (each level is a point), plus its preamble.

Quality is PSNR / SSIM against the output on the exact FP16 cache (the reference). This reads the
template's pack files directly (template data, read-only; no request ever leaves the app), decoding
them with the same stream encodings the device runtime uses. Frontiers are cached as JSON + PNGs
under ``cache_dir`` keyed by the pack files' sizes and mtimes.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

SYSTEMS = ("sakura", "intq", "cachegen")
FILE_SUFFIX = {"sakura": "", "fp16": ".fp16", "intq": ".intq", "cachegen": ".cachegen"}


@dataclass
class Point:
    system: str
    bytes: int
    config: str
    psnr: float
    ssim: float
    psnr_masked: float
    ssim_masked: float
    image: str  # PNG file name inside the frontier's folder


class _FileLink:
    """Byte ranges of a local pack file (what the template server would send)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self, ranges) -> list[bytes]:
        out = []
        with open(self.path, "rb") as f:
            for off, n in ranges:
                f.seek(off)
                out.append(f.read(n))
        return out

    def header(self) -> bytes:
        with open(self.path, "rb") as f:
            first = f.read(8)
            return first + f.read(int.from_bytes(first, "little"))


class Explorer:
    def __init__(self, packs_dir: str | Path, cache_dir: str | Path, catalog=None, budgets: int = 9,
                 baseline_levels: int | None = None):
        """``budgets``: SAKURA budget points (log-spaced); ``baseline_levels``: at most this many IntQ
        widths / CacheGen levels (evenly spaced, smallest first; None = all)."""
        self.packs = Path(packs_dir)
        self.cache = Path(cache_dir)
        self.catalog_path = catalog
        self.budgets = max(1, int(budgets))
        self.baseline_levels = baseline_levels
        self._lock = threading.Lock()

    # ---------------------------------------------------------------------------------------------
    def catalog(self):
        from sakura.catalog import load_catalog

        return load_catalog(self.catalog_path)

    def available(self) -> list[str]:
        """Templates whose four stored formats are all in the pack folder."""
        out = []
        for t in self.catalog():
            if all((self.packs / f"{t.id}{s}.pack").is_file() for s in FILE_SUFFIX.values()):
                out.append(t.id)
        return out

    def requests(self, template_id: str) -> list[str]:
        """Labels of the template's evaluation requests (the explorer's choices)."""
        return [str(r.label) for r in self.catalog().get(template_id).eval_requests]

    def _key(self, template_id: str, request: int) -> str:
        h = hashlib.sha256(f"{template_id}|{request}|{self.budgets}|{self.baseline_levels}".encode())
        for s in FILE_SUFFIX.values():
            p = self.packs / f"{template_id}{s}.pack"
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
        return h.hexdigest()[:16]

    def folder(self, template_id: str, request: int) -> Path:
        return self.cache / f"{template_id}-{request}-{self._key(template_id, request)}"

    def cached(self, template_id: str, request: int) -> dict | None:
        f = self.folder(template_id, request) / "frontier.json"
        if f.is_file():
            return json.loads(f.read_text())
        return None

    # ---------------------------------------------------------------------------------------------
    def frontier(self, template_id: str, request: int, progress: Callable[[float, str], None] | None = None) -> dict:
        """``{"template_id", "request", "fp16_bytes", "reference": png name, "mask": png name,
        "points": [Point...]}``, computed once and cached on disk."""
        have = self.cached(template_id, request)
        if have:
            return have
        with self._lock:  # one computation at a time (2 cores); a second caller finds it cached
            have = self.cached(template_id, request)
            if have:
                return have
            return self._compute(template_id, request, progress or (lambda f, m: None))

    def _compute(self, template_id: str, request: int, say: Callable[[float, str], None]) -> dict:
        import torch
        from PIL import Image

        from sakura.editing import edit_request, model_for
        from sakura.eval.metrics import quality
        from sakura.online.encodings import encoding_from_header

        say(0.0, "loading the model and the template")
        tpl = self.catalog().get(template_id)
        reqs = tpl.eval_requests
        if not 0 <= request < len(reqs):
            raise ValueError(f"{template_id} has {len(reqs)} evaluation requests; no request #{request}")
        model = model_for(tpl)
        req = edit_request(tpl, reqs[request], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
        out = self.folder(template_id, request)
        out.mkdir(parents=True, exist_ok=True)

        encs, links = {}, {}
        for name in ("fp16",) + SYSTEMS:
            links[name] = _FileLink(self.packs / f"{template_id}{FILE_SUFFIX[name]}.pack")
            encs[name] = encoding_from_header(name, links[name].header())

        def run(name: str, choose: Callable) -> tuple[np.ndarray, int, list[str]]:
            enc = encs[name].fresh()
            link = links[name]
            nbytes = 0
            pre = enc.preamble_ranges()
            if pre:
                enc.set_preamble(link.read(pre))
                nbytes += sum(n for _, n in pre)
            kv, labels = {}, []
            for u in enc.units:
                lv = choose(u)
                rs = enc.ranges(u, lv)
                kv.update(enc.decode(u, lv, link.read(rs)))
                nbytes += sum(n for _, n in rs)
                labels.append(lv.label)
            res = model.masked_edit(req, lambda s, l: tuple(t.to(torch.float32) for t in kv[(s, l)]))
            return res.image, nbytes, labels

        plans: list[tuple[str, Callable]] = []
        sak_units = encs["sakura"].units
        lo = sum(min(lv.nbytes for lv in u.levels) for u in sak_units)
        hi = sum(max(lv.nbytes for lv in u.levels) for u in sak_units)
        seen = set()
        for b in (np.geomspace(max(lo, 1), hi, self.budgets) if self.budgets > 1 else [hi]):
            per = b / len(sak_units)
            pick = tuple(_best_within(u.levels, per).label for u in sak_units)
            if pick not in seen:
                seen.add(pick)
                plans.append(("sakura", lambda u, per=per: _best_within(u.levels, per)))
        for name in ("intq", "cachegen"):
            units = encs[name].units
            labels = sorted({lv.label for u in units for lv in u.levels},
                            key=lambda lab: sum(lv.nbytes for u in units for lv in u.levels if lv.label == lab))
            for lab in _spread(labels, self.baseline_levels):
                plans.append((name, lambda u, lab=lab: next(lv for lv in u.levels if lv.label == lab)))

        total = len(plans) + 1
        say(0.02, f"reference: masked edit on the exact FP16 cache (1/{total})")
        ref, fp16_bytes, _ = run("fp16", lambda u: u.levels[0])
        Image.fromarray(_u8(ref)).save(out / "reference.png")
        Image.fromarray((req.mask * 255).astype(np.uint8)).save(out / "mask.png")
        points = []
        for i, (name, choose) in enumerate(plans, start=2):
            say((i - 1) / total, f"{name}: rebuilding the cache from its bytes and editing ({i}/{total})")
            img, nbytes, labels = run(name, choose)
            q = quality(img, ref, req.mask)
            fname = f"{name}-{i:02d}.png"
            Image.fromarray(_u8(img)).save(out / fname)
            points.append(Point(name, int(nbytes), _summarise(labels), q["psnr"], q["ssim"], q["psnr_masked"],
                                q["ssim_masked"], fname))
        data = {"template_id": template_id, "request": request, "request_label": str(reqs[request].label),
                "fp16_bytes": int(fp16_bytes), "reference": "reference.png", "mask": "mask.png",
                "points": [asdict(p) for p in sorted(points, key=lambda p: (p.system, p.bytes))]}
        (out / "frontier.json").write_text(json.dumps(data, indent=1))
        say(1.0, "done")
        return data

    # ---------------------------------------------------------------------------------------------
    @staticmethod
    def at_budget(data: dict, budget_bytes: float) -> dict[str, dict | None]:
        """Per system, the best-quality point that sends at most ``budget_bytes`` (None if none fits)."""
        out: dict[str, dict | None] = {}
        for s in SYSTEMS:
            fit = [p for p in data["points"] if p["system"] == s and p["bytes"] <= budget_bytes]
            out[s] = max(fit, key=lambda p: (p["psnr"], -p["bytes"])) if fit else None
        return out


def _spread(items: list, k: int | None) -> list:
    """At most ``k`` of ``items``, evenly spaced, the first always included."""
    if k is None or k >= len(items):
        return list(items)
    if k <= 1:
        return items[:1]
    idx = sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})
    return [items[i] for i in idx]


def _best_within(levels, budget):
    fitting = [lv for lv in levels if lv.nbytes <= budget]
    if not fitting:
        return min(levels, key=lambda lv: lv.nbytes)
    return min(fitting, key=lambda lv: (lv.error, lv.nbytes))


def _summarise(labels: list[str]) -> str:
    """'int4' when every unit used the same level, else the distinct levels with counts."""
    counts: dict[str, int] = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    if len(counts) == 1:
        return labels[0]
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:4]) + (
        "…" if len(counts) > 4 else "")


def _u8(img: np.ndarray) -> np.ndarray:
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8)


def frontier_figure(data: dict, budget_bytes: float | None = None, metric: str = "psnr"):
    import plotly.graph_objects as go

    colors = {"sakura": "#d6336c", "intq": "#1c7ed6", "cachegen": "#37b24d"}
    names = {"sakura": "SAKURA", "intq": "IntQ", "cachegen": "CacheGen"}
    fig = go.Figure()
    for s in SYSTEMS:
        pts = sorted((p for p in data["points"] if p["system"] == s), key=lambda p: p["bytes"])
        fig.add_trace(go.Scatter(x=[p["bytes"] / 1e6 for p in pts], y=[p[metric] for p in pts], mode="lines+markers",
                                 name=names[s], line=dict(color=colors[s], width=2), marker=dict(size=8),
                                 customdata=[[p["config"], p["ssim"], p["psnr_masked"]] for p in pts],
                                 hovertemplate=("%{x:.2f} MB · %{y:.2f}<br>%{customdata[0]}<br>SSIM %{customdata[1]:.4f}"
                                                " · masked PSNR %{customdata[2]:.2f} dB<extra>" + names[s] + "</extra>")))
    # shapes and annotations on a log axis take log10 coordinates
    xs = [p["bytes"] / 1e6 for p in data["points"]] + [data["fp16_bytes"] / 1e6]
    lo, hi = math.log10(min(xs)) - 0.08, math.log10(max(xs)) + 0.08
    marks = [(data["fp16_bytes"], "FP16 cache", "#adb5bd", "dot")]
    if budget_bytes is not None:
        marks.append((budget_bytes, f"budget {budget_bytes / 1e6:.2f} MB", "#495057", "dash"))
    for b, text, color, dash in marks:
        x = math.log10(max(b, 1) / 1e6)
        fig.add_shape(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1, line=dict(color=color, dash=dash))
        fig.add_annotation(x=x, y=1.0, xref="x", yref="paper", text=text, showarrow=False, yanchor="bottom",
                           font=dict(size=11, color=color))
    fig.update_layout(title=dict(text=f"quality vs bytes sent — {data['template_id']}, request “{data['request_label']}”",
                                 x=0.01, font=dict(size=14)),
                      xaxis=dict(title="bytes sent (MB, log scale)", type="log", range=[lo, hi]),
                      yaxis=dict(title={"psnr": "PSNR vs FP16-cache output (dB)", "ssim": "SSIM"}.get(metric, metric)),
                      height=440, margin=dict(l=10, r=10, t=90, b=40), template="plotly_white",
                      legend=dict(orientation="h", y=1.1, yanchor="bottom", x=1, xanchor="right"))
    return fig
