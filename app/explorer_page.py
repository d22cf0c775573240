"""The quality explorer tab: a byte-budget slider over the Fig. 15 frontier of one template + request."""

from __future__ import annotations

import html
import math

import gradio as gr
import numpy as np
from PIL import Image

from app.explorer import SYSTEMS_SHOWN, at_budget, frontier_figure
from device_bridge import SYSTEMS

NAMES = {s: SYSTEMS[s].label for s in SYSTEMS_SHOWN}
SLIDER_MAX = 100
QUALITY = {"masked region": "psnr_masked", "whole image": "psnr"}  # what the plot and the best point go by
AMPLIFY = {"×1": 1, "×4": 4, "×16": 16}


def _span(data: dict) -> tuple[float, float]:
    """The slider's byte range: the smallest point any system can reach (something fits at the left end) to
    the FP16 cache."""
    lo = max(1.0, float(min(p["bytes"] for p in data["points"])))
    return lo, max(lo * 1.0001, float(max(data["fp16_bytes"], max(p["bytes"] for p in data["points"]))))


def budget_of(v: float, data: dict) -> float:
    """Slider position (0..100, log scale) → bytes, from the smallest point to the FP16 size."""
    lo, hi = _span(data)
    return lo * (hi / lo) ** (max(0.0, min(SLIDER_MAX, float(v))) / SLIDER_MAX)


def slider_of(budget: float, data: dict) -> float:
    lo, hi = _span(data)
    return SLIDER_MAX * math.log(max(budget, lo) / lo) / math.log(hi / lo)


def difference(image: Image.Image, reference: Image.Image, gain: int) -> Image.Image:
    """|image − reference| × ``gain``, clipped: where and how much a system's output departs from the FP16-cache
    output."""
    a = np.asarray(image.convert("RGB"), np.int16)
    b = np.asarray(reference.convert("RGB").resize(image.size), np.int16)
    return Image.fromarray(np.clip(np.abs(a - b) * gain, 0, 255).astype(np.uint8))


class ExplorerPage:
    def __init__(self, explorer):
        """``explorer``: a :class:`sakura.eval.explorer.Explorer` (made by ``app/cli.py``)."""
        self.ex = explorer

    def build(self, tab=None) -> None:
        """``tab``: the explorer's tab; opening it refreshes the templates (packs built behind the page appear)."""
        avail = self._available()
        data_state = gr.State(None)
        gr.Markdown("Each point is a real masked edit whose template cache was rebuilt from exactly the bytes "
                    "that configuration sends. Quality is measured against the output on the exact FP16 cache. "
                    "Move the budget: each system shows its best output that fits.")
        with gr.Row():
            tpl = gr.Dropdown(avail, value=avail[0] if avail else None, label="Template", elem_id="ex-template",
                              scale=2)
            req = gr.Dropdown(self._requests(avail[0]) if avail else [], value=0 if avail else None, label="Request",
                              elem_id="ex-request", scale=3)
            load = gr.Button("Compute frontier", variant="primary", elem_id="ex-load", scale=1)
        status = gr.HTML(self._intro(avail), elem_id="ex-status")
        if tab is not None:
            tab.select(self.refresh, tpl, [tpl, status], queue=False, show_progress="hidden")
        budget = gr.Slider(0, SLIDER_MAX, value=35, step=0.5, label="Byte budget (log scale: left = tiny, right = "
                           "the full FP16 cache)", elem_id="ex-budget", interactive=True)
        with gr.Row():
            quality = gr.Radio(list(QUALITY), value="masked region", label="Quality of", elem_id="ex-metric")
            gain = gr.Radio(list(AMPLIFY), value="×4", label="Difference maps amplified", elem_id="ex-gain")
        budget_txt = gr.HTML("", elem_id="ex-budget-text")
        plot = gr.Plot(label="Quality vs bytes sent", elem_id="ex-plot")
        with gr.Row(equal_height=True):
            ref = gr.Image(label="FP16-cache reference", type="pil", interactive=False, height=240)
            imgs = [gr.Image(label=NAMES[s], type="pil", interactive=False, height=240, elem_id=f"ex-img-{s}")
                    for s in SYSTEMS_SHOWN]
        with gr.Row(equal_height=True):
            gr.HTML("<div class='sk-hint'>Difference from the FP16-cache reference (black: identical), amplified "
                    "as chosen above.</div>")
            diffs = [gr.Image(label=f"{NAMES[s]} − reference", type="pil", interactive=False, height=240,
                              elem_id=f"ex-diff-{s}") for s in SYSTEMS_SHOWN]
        table = gr.HTML("", elem_id="ex-table")

        tpl.change(lambda t: gr.update(choices=self._requests(t), value=0), tpl, req, queue=False)
        view = [data_state, budget, quality, gain]
        shown = [budget_txt, plot, *imgs, *diffs, table]
        outs = [status, data_state, budget, ref, *shown]
        load.click(self.compute, [tpl, req, budget, quality, gain], outs, concurrency_limit=1,
                   concurrency_id="explorer")
        budget.release(self.show, view, shown, show_progress="hidden", queue=False)
        budget.change(self.show, view, shown, show_progress="hidden", trigger_mode="always_last", queue=False)
        for control in (quality, gain):
            control.change(self.show, view, shown, show_progress="hidden", queue=False)

    def _available(self) -> list[str]:
        try:
            return self.ex.available()
        except Exception:  # noqa: BLE001 - no pack store / unreadable catalog: the page says "none yet"
            return []

    @staticmethod
    def _intro(avail: list[str]) -> str:
        if avail:
            return ("<div class='sk-status sk-info'>Pick a template and a request, then compute its frontier (cached "
                    "after the first time).</div>")
        return ("<div class='sk-status sk-warn'>No template has all its packs in the pack store yet, so the explorer "
                "has nothing to decode. Templates building in the background appear here once published (open this "
                "tab again); or build packs with <code>sakura build</code>.</div>")

    def refresh(self, current):
        """The tab was opened: offer every template whose packs are published now, keeping the one picked (a new
        pick updates the requests through the dropdown's change event)."""
        avail = self._available()
        value = current if current in avail else (avail[0] if avail else None)
        return gr.update(choices=avail, value=value), self._intro(avail)

    def _requests(self, template_id: str):
        try:
            return [(f"#{i} · {label}", i) for i, label in enumerate(self.ex.requests(template_id))]
        except Exception:  # noqa: BLE001
            return []

    def compute(self, template_id, request, slider, quality="masked region", gain="×4", progress=gr.Progress()):
        def say(frac, msg):
            progress(frac, desc=msg)

        say(0.0, "decoding and running every configuration (the first time for this request: a minute or two)")
        try:
            if not template_id or request is None:
                raise ValueError("pick a template and a request")
            data = self.ex.frontier(template_id, int(request), say)
        except Exception as e:  # noqa: BLE001 - a friendly line, the app keeps working
            msg = f"Cannot compute this frontier: {' '.join(str(e).split())[:300]}"
            gr.Warning(msg)
            return (f"<div class='sk-status sk-warn'>{html.escape(msg)}</div>", None, gr.update(), None,
                    *self._empty())
        n = len(data["points"])
        return (f"<div class='sk-status sk-ok'>{n} configurations decoded and run for {html.escape(template_id)}, "
                f"request #{int(request)}.</div>", data, gr.update(), self._reference(data),
                *self.show(data, slider, quality, gain))

    @staticmethod
    def _empty() -> tuple:
        return ("", None, *([None] * (2 * len(SYSTEMS_SHOWN))), "")

    def _reference(self, data: dict) -> Image.Image:
        return Image.open(self.ex.folder_of(data) / data["reference"]).convert("RGB")

    def show(self, data, slider, quality="masked region", gain="×4"):
        if not data:
            return self._empty()
        metric, k = QUALITY.get(quality, "psnr_masked"), AMPLIFY.get(gain, 4)
        b = budget_of(slider, data)
        best = at_budget(data, b, metric)
        folder = self.ex.folder_of(data)
        reference = self._reference(data)
        images, diffs, rows = [], [], []
        for s in SYSTEMS_SHOWN:
            p = best[s]
            if p is None:
                images.append(gr.update(value=None, label=f"{NAMES[s]}: nothing fits this budget"))
                diffs.append(gr.update(value=None, label=f"{NAMES[s]} − reference"))
                rows.append(f"<tr><td>{NAMES[s]}</td><td colspan=5>nothing fits</td></tr>")
                continue
            img = Image.open(folder / p["image"]).convert("RGB")
            images.append(gr.update(value=img, label=f"{NAMES[s]} · {p['bytes'] / 1e6:.2f} MB · "
                                                     f"{p[metric]:.1f} dB {quality}"))
            diffs.append(gr.update(value=difference(img, reference, k), label=f"{NAMES[s]} − reference, ×{k}"))
            rows.append(
                f"<tr><td>{NAMES[s]}</td><td>{p['bytes'] / 1e6:.3f}</td>"
                f"<td>{p['bytes'] / data['fp16_bytes']:.1%}</td><td>{p['psnr_masked']:.2f} / {p['psnr']:.2f}</td>"
                f"<td>{p['ssim_masked']:.4f} / {p['ssim']:.4f}</td><td>{html.escape(p['config'])}</td></tr>"
            )
        table = ("<table class='sk-table'><tr><th>system</th><th>MB sent</th><th>vs FP16</th><th>PSNR masked / whole"
                 "</th><th>SSIM masked / whole</th><th>configuration</th></tr>" + "".join(rows) + "</table>")
        txt = (f"<div class='sk-budget'>Budget <b>{b / 1e6:.3f} MB</b> = {b / data['fp16_bytes']:.1%} of the "
               f"{data['fp16_bytes'] / 1e6:.1f} MB FP16 cache</div>")
        return (txt, frontier_figure(data, b, metric), *images, *diffs, table)
