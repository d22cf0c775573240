"""The edit page: pick a template, give a photo or an instruction, pick a network and a system, run.

While the edit runs, a generator streams the device's events into the live timeline; when it ends
the page shows the output beside the FP16-reference output, the metrics, a difference heat-map,
the latency breakdown and what left the device. Every failure becomes a line in the status box
(and a toast for input problems), never a traceback.
"""

from __future__ import annotations

import html
import random
from pathlib import Path

import gradio as gr

from app.device import COMPARE_ORDER, SYSTEM_LABELS, EditRun
from app.images import UploadError, check_upload, diff_heatmap, from_b64, png_b64
from app.timeline import EditTimeline, latency_figure

TASK_TITLES = {"fs": "Face swap", "vton": "Virtual try-on", "mb": "Text edit"}
NETWORKS = [("5G (mmWave, walking)", "5g"), ("4G + 5G (mixed)", "4g5g"), ("Wi-Fi 6", "wifi"),
            ("Fixed rate", "fixed"), ("Upload a trace file", "upload")]
SYSTEMS = [(SYSTEM_LABELS[s], s) for s in ("sakura", "fp16", "intq", "cachegen", "local", "oracle")] + [
    ("Compare all (same trace start)", "all")]
MAX_TRACE_BYTES = 4 * 1024 * 1024
MAX_PROMPT = 2000
TRACE_HORIZON_S = 600.0


def _slim(res: dict) -> dict:
    """What the page keeps of a result to re-show it (the per-unit timeline is in the events)."""
    return {k: v for k, v in res.items() if k != "timeline"}


def _esc(x) -> str:
    return html.escape(str(x))


def status_html(text: str, kind: str = "info") -> str:
    return f'<div class="sk-status sk-{kind}" role="status">{_esc(text)}</div>'


# --------------------------------------------------------------------------------------- inputs
def check_trace_upload(path: str | None) -> dict:
    """Validate an uploaded trace with the library's loader → ``{"name", "csv", "summary"}``; raises
    :class:`UploadError` with a friendly line."""
    from sakura.net.traces import TraceError, read_trace_file

    if not path:
        raise UploadError("Please choose a trace file (CSV `time_s,mbps` or two columns `time Mbps`).")
    p = Path(path)
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise UploadError(f"“{p.name}” is larger than {MAX_TRACE_BYTES >> 20} MB; a per-second trace of an hour is "
                          "far smaller. Please upload a smaller trace.")
    try:
        tr = read_trace_file(p)
        text = p.read_text(encoding="utf-8")
    except (TraceError, UnicodeDecodeError, OSError) as e:
        msg = str(e).replace(str(p), p.name)
        raise UploadError(f"That trace file cannot be used: {msg}. Expected CSV with header `time_s,mbps`, "
                          "or two whitespace-separated columns `time throughput_mbps`.") from None
    s = tr.stats() if hasattr(tr, "stats") else {}
    summary = (f"{p.name}: {tr.duration:.0f} s, median {tr.median_mbps:.1f} Mbps"
               + (f", p10 {s['p10']:.1f} / p90 {s['p90']:.1f}" if "p10" in s and "p90" in s else ""))
    return {"name": p.name, "csv": text, "summary": summary}


def network_spec(choice: str, fixed_mbps, trace_upload: dict | None, start, paper_regime: bool) -> dict:
    if choice == "fixed":
        try:
            mbps = float(fixed_mbps)
        except (TypeError, ValueError):
            raise UploadError("Please give the fixed link rate in Mbps (a number > 0).") from None
        if not 0 < mbps <= 1e6:
            raise UploadError("The fixed link rate must be between 0 and 1,000,000 Mbps.")
        net = {"trace": f"fixed:{mbps:g}", "regime": "none", "scale": None}
    elif choice == "upload":
        if not trace_upload:
            raise UploadError("Please upload a trace file first (or pick another network).")
        net = {"trace": trace_upload["name"], "trace_csv": trace_upload["csv"],
               "regime": "paper" if paper_regime else "none", "scale": None}
    elif choice in ("5g", "4g5g", "wifi"):
        net = {"trace": choice, "regime": "paper" if paper_regime else "none", "scale": None}
    else:
        raise UploadError("Please pick a network.")
    if start is None or str(start).strip().lower() in ("", "random"):
        net["start"] = None
    else:
        try:
            st = float(start)
        except (TypeError, ValueError):
            raise UploadError("The trace start must be a number of seconds (or empty for a random start).") from None
        if st < 0:
            raise UploadError("The trace start must be ≥ 0 seconds.")
        net["start"] = st
    return net


# --------------------------------------------------------------------------------------- results
def metrics_html(result: dict) -> str:
    m = result.get("metrics") or {}
    s = result.get("summary") or {}
    fp16 = s.get("fp16_bytes") or 0
    sent = s.get("bytes") or 0

    def card(title, value, sub=""):
        return (f'<div class="sk-card"><div class="sk-card-t">{_esc(title)}</div>'
                f'<div class="sk-card-v">{value}</div><div class="sk-card-s">{sub}</div></div>')

    def num(x, fmt):
        return "—" if not isinstance(x, (int, float)) else format(x, fmt)

    cards = [
        card("PSNR (whole / masked)", f"{num(m.get('psnr'), '.2f')} / {num(m.get('psnr_masked'), '.2f')} dB",
             "vs FP16-cache output"),
        card("SSIM (whole / masked)", f"{num(m.get('ssim'), '.4f')} / {num(m.get('ssim_masked'), '.4f')}",
             "vs FP16-cache output"),
        card("Latency", f"{num(s.get('latency_s'), '.3f')} s",
             f"execution {num((s.get('latency_s') or 0) - (s.get('stall_s') or 0), '.3f')} s + stalls "
             f"{num(s.get('stall_s'), '.3f')} s"),
        card("Transfer", f"{num(s.get('transfer_hidden_s'), '.3f')} s hidden",
             f"{num(s.get('transfer_exposed_s'), '.3f')} s exposed (execution waited)"),
        card("Bytes sent", f"{sent / 1e6:.2f} MB",
             f"{(sent / fp16 if fp16 else 0):.1%} of the {fp16 / 1e6:.1f} MB FP16 cache" if fp16 else ""),
    ]
    levels = s.get("levels") or []
    if levels:
        distinct = list(dict.fromkeys(levels))
        lv = ", ".join(distinct[:6]) + ("…" if len(distinct) > 6 else "")
        cards.append(card("Levels chosen", f"{len(distinct)} distinct", _esc(lv)))
    return f'<div class="sk-cards" id="sk-metrics-cards">{"".join(cards)}</div>'


def privacy_rows(sent: list[dict]) -> list[list]:
    rows = []
    for i, r in enumerate(sent or []):
        rs = r.get("ranges") or []
        shown = ", ".join(f"{o}+{n}" for o, n in rs[:3]) + (f", … ({len(rs)} ranges)" if len(rs) > 3 else "")
        rows.append([i + 1, r.get("file_id", ""), shown, int(r.get("bytes") or 0)])
    return rows


def privacy_html(result: dict, had_photo: bool, had_prompt: bool) -> str:
    sent = result.get("sent_to_server") or []
    files = sorted({r.get("file_id", "") for r in sent})
    total = sum(int(r.get("bytes") or 0) for r in sent)
    edit_bytes = int((result.get("summary") or {}).get("bytes") or 0)
    what = []
    if had_photo:
        what.append("your photo")
    if had_prompt:
        what.append("your instruction")
    kept = " and ".join(what) or "your input"
    extra = ""
    if total > edit_bytes:
        extra = (f" Of that, {edit_bytes / 1e6:.2f} MB streamed the cache for the edit; the rest is pack headers and, "
                 f"for this demo's quality comparison, the exact FP16 cache used to compute the reference output.")
    return (f'<div class="sk-privacy"><b>What left the device:</b> {len(sent)} requests to the template server, '
            f'naming only template files ({_esc(", ".join(files)) or "none"}) and byte ranges, '
            f'{total / 1e6:.2f} MB asked for in total.{extra} <b>{_esc(kept.capitalize())} never left the '
            f'device</b> (0 bytes): the server only learns which parts of which template were fetched.</div>')


def compare_rows(results: dict[str, dict]) -> list[list]:
    rows = []
    for sysname, res in results.items():
        s, m = res.get("summary") or {}, res.get("metrics") or {}
        fp16 = s.get("fp16_bytes") or 0
        rows.append([SYSTEM_LABELS.get(sysname, sysname), round(s.get("latency_s") or 0, 3),
                     round(s.get("stall_s") or 0, 3), round((s.get("bytes") or 0) / 1e6, 3),
                     f"{(s.get('bytes') or 0) / fp16:.1%}" if fp16 else "",
                     *(round(m.get(k), 4) if isinstance(m.get(k), (int, float)) else None
                       for k in ("psnr", "ssim", "psnr_masked", "ssim_masked"))])
    return rows


COMPARE_HEADERS = ["system", "latency s", "stall s", "MB sent", "vs FP16", "PSNR", "SSIM", "PSNR masked",
                   "SSIM masked"]
PRIVACY_HEADERS = ["#", "file id", "byte ranges (offset+length)", "bytes"]


class EditPage:
    """Builds the edit tab inside the current ``gr.Blocks``; talks to ``bridge`` only."""

    def __init__(self, bridge, templates: list[dict]):
        self.bridge = bridge
        self.templates = templates
        self.by_id = {t["id"]: t for t in templates}

    # ------------------------------------------------------------------------------------ layout
    def build(self) -> None:
        ids = [t["id"] for t in self.templates]
        default = next((t["id"] for t in self.templates if t.get("available") is not False), ids[0] if ids else None)
        photo_state = gr.State(None)  # PNG b64 of the checked upload: stays in this process
        trace_state = gr.State(None)
        runs_state = gr.State({})  # system -> {"result", "events"}

        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                gr.Markdown("### 1 · Pick a template  \n<span class='sk-hint'>The tinted area is the editable "
                            "mask: only it is computed on the device; the rest comes from the streamed cache.</span>")
                galleries = []
                for task in ("fs", "vton", "mb"):
                    group = [t for t in self.templates if t["task"] == task]
                    if not group:
                        continue
                    items = [(from_b64(t.get("thumbnail_png_b64")), self._caption(t)) for t in group]
                    g = gr.Gallery(value=items, label=TASK_TITLES[task], columns=4, height=190,
                                   allow_preview=False, object_fit="cover", elem_id=f"gallery-{task}",
                                   elem_classes=["sk-gallery"], interactive=False, fit_columns=False, buttons=[])
                    galleries.append((g, [t["id"] for t in group]))
                template = gr.Dropdown(choices=[(self._caption(t), t["id"]) for t in self.templates], value=default,
                                       label="Template", elem_id="template-dd")
                template_info = gr.HTML(self._template_info(default), elem_id="template-info")
            with gr.Column(scale=2, min_width=340):
                gr.Markdown("### 2 · Your input")
                photo = gr.File(label="Your photo (PNG or JPEG) — stays on the device", file_count="single",
                                type="filepath", elem_id="photo-upload", height=110)
                preview = gr.Image(label="Photo the device will use", type="pil", interactive=False, height=160,
                                   elem_id="photo-preview", visible=self._task(default) != "mb")
                prompt = gr.Textbox(label="Instruction — stays on the device", placeholder="e.g. make it a red sports car",
                                    lines=2, max_lines=4, elem_id="prompt", visible=self._task(default) == "mb")
                gr.Markdown("### 3 · Network")
                network = gr.Radio(NETWORKS, value="5g", label="Link", elem_id="network")
                with gr.Row():
                    fixed = gr.Number(value=100, label="Fixed rate (Mbps)", visible=False, elem_id="fixed-mbps",
                                      minimum=0)
                    start = gr.Textbox(value="", label="Trace start (s)", placeholder="random",
                                       elem_id="trace-start", max_lines=1)
                trace_file = gr.File(label="Trace file (CSV time_s,mbps)", file_count="single", type="filepath",
                                     visible=False, elem_id="trace-upload", height=90)
                regime = gr.Checkbox(value=True, label="Paper regime: scale the trace so FP16 transfer at its median "
                                     "vs local generation = 23 s vs 13 s, as in the paper", elem_id="regime")
                gr.Markdown("### 4 · System")
                system = gr.Radio(SYSTEMS, value="sakura", label="System", elem_id="system")
                run = gr.Button("Run edit", variant="primary", elem_id="run-btn")
        status = gr.HTML(status_html("Pick a template, give it a photo (or an instruction), and run."),
                         elem_id="status")
        timeline = gr.Plot(EditTimeline(system="—").figure("live timeline (waiting for an edit)"),
                           label="Live timeline", elem_id="timeline")
        with gr.Row():
            view = gr.Dropdown(choices=[], value=None, label="Show run", visible=False, elem_id="view-run", scale=1)
        with gr.Row(equal_height=True):
            out_img = gr.Image(label="Output", type="pil", interactive=False, elem_id="out-image", height=300)
            ref_img = gr.Image(label="FP16-reference output", type="pil", interactive=False, elem_id="ref-image",
                               height=300)
            diff_img = gr.Image(label="Difference |output − reference| ×4", type="pil", interactive=False,
                                elem_id="diff-image", height=300)
        metrics = gr.HTML("", elem_id="metrics")
        latency = gr.Plot(label="Latency breakdown and bytes", elem_id="latency", visible=False, show_label=False)
        compare = gr.Dataframe(headers=COMPARE_HEADERS, value=None, label="All systems, same trace and start",
                               visible=False, interactive=False, elem_id="compare-table", wrap=True)
        outputs_gallery = gr.Gallery(label="Outputs per system", visible=False, columns=6, height=230,
                                     allow_preview=True, elem_id="compare-gallery", interactive=False)
        with gr.Accordion("Privacy: what left the device", open=True, elem_id="privacy-panel"):
            privacy = gr.HTML("<div class='sk-privacy'>Nothing yet: run an edit.</div>", elem_id="privacy")
            privacy_table = gr.Dataframe(headers=PRIVACY_HEADERS, value=None, interactive=False, max_height=260,
                                         elem_id="privacy-table", label="Requests to the template server")

        self._c = dict(status=status, timeline=timeline, out_img=out_img, ref_img=ref_img, diff_img=diff_img,
                       metrics=metrics, latency=latency, compare=compare, outputs_gallery=outputs_gallery,
                       privacy=privacy, privacy_table=privacy_table, view=view, runs_state=runs_state)

        # ------------------------------------------------------------------------------- wiring
        for g, gids in galleries:
            g.select(self._picker(gids), None, template, show_progress="hidden", queue=False)
        template.change(self.on_template, template, [template_info, preview, prompt, photo, photo_state, status],
                        show_progress="hidden", queue=False)
        photo.upload(self.on_photo, photo, [preview, photo_state, status, photo], show_progress="minimal")
        photo.clear(lambda: (None, None, status_html("Photo removed.")), None, [preview, photo_state, status],
                    queue=False)
        network.change(self.on_network, network, [fixed, trace_file, regime], queue=False, show_progress="hidden")
        trace_file.upload(self.on_trace, trace_file, [trace_state, status, trace_file], show_progress="minimal")
        trace_file.clear(lambda: (None, status_html("Trace file removed.")), None, [trace_state, status], queue=False)
        outs = [status, timeline, out_img, ref_img, diff_img, metrics, latency, compare, outputs_gallery, privacy,
                privacy_table, view, runs_state]
        run.click(self.run, [template, photo_state, prompt, network, fixed, trace_state, start, regime, system],
                  outs, show_progress="minimal", concurrency_limit=1, concurrency_id="device")
        view.change(self.on_view, [view, runs_state, photo_state, prompt, template],
                    [timeline, out_img, ref_img, diff_img, metrics, privacy, privacy_table], show_progress="hidden",
                    queue=False)

    # ------------------------------------------------------------------------------- handlers
    def _caption(self, t: dict) -> str:
        title = str(t.get("title") or t["id"]).split(",")[0]
        title = title if len(title) <= 26 else title[:25] + "…"
        cap = f"{title} · mask {t.get('mask_ratio', 0):.0%}"
        if t.get("available") is False:
            cap += " · packs not built"
        return cap

    def _task(self, tid: str | None) -> str:
        return (self.by_id.get(tid) or {}).get("task", "fs")

    def _template_info(self, tid: str | None) -> str:
        t = self.by_id.get(tid)
        if not t:
            return "<div class='sk-tinfo'>No template selected.</div>"
        need = "an instruction" if t["task"] == "mb" else ("a face photo" if t["task"] == "fs" else "a garment photo")
        avail = "" if t.get("available") is not False else " <b class='sk-warn'>Its packs are not on the template server.</b>"
        return (f"<div class='sk-tinfo'><b>{_esc(t.get('title') or t['id'])}</b> · <code>{_esc(t['id'])}</code> · "
                f"{_esc(TASK_TITLES.get(t['task'], t['task']))} · model {_esc(t.get('model', ''))} · "
                f"mask {t.get('mask_ratio', 0):.1%} of pixels, {t.get('token_ratio', 0):.1%} of tokens · "
                f"needs {need}.{avail}</div>")

    @staticmethod
    def _picker(gids: list[str]):
        def pick(evt: gr.SelectData):
            i = evt.index if isinstance(evt.index, int) else (evt.index[0] if evt.index else 0)
            return gids[i] if 0 <= i < len(gids) else gr.update()

        return pick

    def on_template(self, tid):
        task = self._task(tid)
        photo_task = task != "mb"
        return (self._template_info(tid), gr.update(visible=photo_task, value=None),
                gr.update(visible=not photo_task), gr.update(visible=photo_task, value=None), None,
                status_html(f"Template {tid} selected: " + ("type an instruction." if not photo_task
                                                            else "upload a photo.")))

    def on_photo(self, path):
        try:
            img = check_upload(path)
        except UploadError as e:
            gr.Warning(str(e))
            return None, None, status_html(str(e), "warn"), None
        except Exception as e:  # noqa: BLE001
            msg = f"That file could not be read ({type(e).__name__}). Please upload a PNG or JPEG photo."
            gr.Warning(msg)
            return None, None, status_html(msg, "warn"), None
        return (img, png_b64(img), status_html(f"Photo ready ({img.width}×{img.height}); it stays on the device.",
                                               "ok"), gr.update())

    def on_network(self, choice):
        return (gr.update(visible=choice == "fixed"), gr.update(visible=choice == "upload"),
                gr.update(visible=choice not in ("fixed",)))

    def on_trace(self, path):
        try:
            tr = check_trace_upload(path)
        except UploadError as e:
            gr.Warning(str(e))
            return None, status_html(str(e), "warn"), None
        except Exception as e:  # noqa: BLE001
            msg = f"That trace file could not be read ({type(e).__name__})."
            gr.Warning(msg)
            return None, status_html(msg, "warn"), None
        return tr, status_html(f"Trace ready: {tr['summary']}. The device emulates it (it is not sent to the "
                               "template server).", "ok"), gr.update()

    # ------------------------------------------------------------------------------------ run
    def _validate(self, tid, photo_b64, prompt) -> dict:
        t = self.by_id.get(tid)
        if not t:
            raise UploadError("Please pick a template first.")
        if t.get("available") is False:
            raise UploadError(f"Template {tid} has no packs on the template server yet; build them with "
                              f"`sakura build --templates {tid}` or pick another template.")
        if t["task"] == "mb":
            p = (prompt or "").strip()
            if not p:
                raise UploadError("Please type an instruction for this text edit (the prompt is empty).")
            if len(p) > MAX_PROMPT:
                raise UploadError(f"The instruction is too long ({len(p)} characters; at most {MAX_PROMPT}).")
            return {"prompt": p, "reference_png_b64": None}
        if not photo_b64:
            what = "a face photo" if t["task"] == "fs" else "a photo of a garment"
            raise UploadError(f"Please upload {what} first (PNG or JPEG).")
        return {"prompt": None, "reference_png_b64": photo_b64}

    def run(self, tid, photo_b64, prompt, network, fixed, trace_up, start, regime, system):
        out = {}
        try:
            inputs = self._validate(tid, photo_b64, prompt)
            net = network_spec(network, fixed, trace_up, start, bool(regime))
        except UploadError as e:
            gr.Warning(str(e))
            yield self._o("status", status_html(str(e), "warn"))
            return
        systems = list(COMPARE_ORDER) if system == "all" else [system]
        if len(systems) > 1 and net.get("start") is None:
            net["start"] = round(random.uniform(0.0, TRACE_HORIZON_S), 1)  # one start for every system
        results: dict[str, dict] = {}
        runs: dict[str, dict] = {}
        had_photo, had_prompt = inputs["reference_png_b64"] is not None, inputs["prompt"] is not None
        yield self._reset_outputs(len(systems) > 1)
        for k, sysname in enumerate(systems):
            job = {"template_id": tid, "system": sysname, **inputs, "network": net, "reference_output": True}
            tl = EditTimeline(system=SYSTEM_LABELS.get(sysname, sysname))
            events: list[dict] = []
            prefix = f"[{k + 1}/{len(systems)}] " if len(systems) > 1 else ""
            er = EditRun(self.bridge, job).start()
            last_status = ""
            for batch in er.events():
                for ev in batch:
                    if ev.get("type") != "result":
                        events.append(ev)
                    tl.apply(ev)
                    if ev.get("type") in ("status", "queued") and ev.get("message"):
                        last_status = str(ev["message"])
                    if ev.get("type") == "plan" and len(systems) > 1 and net.get("start") is None:
                        net["start"] = ev.get("trace_start")
                line = prefix + tl.status_line() + (f" · {last_status}" if last_status and not tl.planned else "")
                yield {**self._o("status", status_html(line, "run")),
                       **self._o("timeline", tl.figure(f"live timeline — {tl.system}"))}
            if er.problem is not None:
                p = er.problem
                if p.user_fixable:
                    gr.Warning(p.friendly)
                msg = prefix + f"{SYSTEM_LABELS.get(sysname, sysname)}: {p.friendly}"
                yield self._o("status", status_html(msg, "warn" if p.user_fixable else "error"))
                if p.user_fixable or len(systems) == 1:
                    return
                continue
            res = er.result or {}
            results[sysname] = res
            runs[sysname] = {"result": _slim(res), "events": events}
            if (sysname == "sakura" or len(results) == 1):
                out = self._render(res, tl, had_photo, had_prompt)
                yield out
        if not results:
            return
        final = {}
        lat_rows = [{**(r.get("summary") or {}), "system": SYSTEM_LABELS.get(s, s)} for s, r in results.items()]
        final.update(self._o("latency", gr.update(value=latency_figure(lat_rows), visible=True)))
        if len(systems) > 1:
            final.update(self._o("compare", gr.update(value=compare_rows(results), visible=True)))
            final.update(self._o("outputs_gallery", gr.update(
                value=[(from_b64(r.get("image_png_b64")), SYSTEM_LABELS.get(s, s)) for s, r in results.items()],
                visible=True)))
        choices = [(SYSTEM_LABELS.get(s, s), s) for s in results]
        shown = "sakura" if "sakura" in results else next(iter(results))
        final.update(self._o("view", gr.update(choices=choices, value=shown, visible=len(results) > 1)))
        final.update(self._o("runs_state", runs))
        s = results[shown].get("summary") or {}
        done = (f"Done: {len(results)} system{'s' if len(results) > 1 else ''} ran. " if len(systems) > 1 else
                f"Done: {SYSTEM_LABELS.get(shown, shown)} finished in {s.get('latency_s', 0):.3f} s "
                f"({s.get('stall_s', 0):.3f} s stalled), {s.get('bytes', 0) / 1e6:.2f} MB sent.")
        final.update(self._o("status", status_html(done, "ok")))
        yield final

    def on_view(self, sysname, runs, photo_b64, prompt, tid):
        run = (runs or {}).get(sysname)
        if not run:
            return (gr.update(),) * 7
        tl = EditTimeline(system=SYSTEM_LABELS.get(sysname, sysname))
        for ev in run["events"]:
            tl.apply(ev)
        res = run["result"]
        tl.apply({"type": "result", "summary": res.get("summary")})
        r = self._render(res, tl, self._task(tid) != "mb", self._task(tid) == "mb")
        keys = ["timeline", "out_img", "ref_img", "diff_img", "metrics", "privacy", "privacy_table"]
        return tuple(r[self._c[k]] for k in keys)

    # ------------------------------------------------------------------------------- helpers
    def _render(self, res: dict, tl: EditTimeline, had_photo: bool, had_prompt: bool) -> dict:
        out_im, ref_im = from_b64(res.get("image_png_b64")), from_b64(res.get("reference_png_b64"))
        mask = from_b64(res.get("mask_png_b64"))
        diff = diff_heatmap(out_im, ref_im, mask) if out_im is not None and ref_im is not None else None
        label = SYSTEM_LABELS.get(res.get("system", ""), res.get("system", ""))
        return {**self._o("timeline", tl.figure(f"timeline — {tl.system} (finished)")),
                **self._o("out_img", gr.update(value=out_im, label=f"Output — {label}")),
                **self._o("ref_img", ref_im), **self._o("diff_img", diff),
                **self._o("metrics", metrics_html(res)),
                **self._o("privacy", privacy_html(res, had_photo, had_prompt)),
                **self._o("privacy_table", privacy_rows(res.get("sent_to_server") or []))}

    def _reset_outputs(self, compare: bool) -> dict:
        return {**self._o("out_img", None), **self._o("ref_img", None), **self._o("diff_img", None),
                **self._o("metrics", ""), **self._o("latency", gr.update(visible=False)),
                **self._o("compare", gr.update(value=None, visible=False)),
                **self._o("outputs_gallery", gr.update(value=None, visible=False)),
                **self._o("view", gr.update(visible=False)),
                **self._o("privacy", "<div class='sk-privacy'>Running…</div>"),
                **self._o("privacy_table", None)}

    def _o(self, name: str, value) -> dict:
        return {self._c[name]: value}
