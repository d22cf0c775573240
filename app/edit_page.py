"""The edit page: pick a template, give a photo or an instruction, pick a network and a system, run.

The user's input is checked once, here (:class:`~device_bridge.Photo`, :class:`~device_bridge.TraceUpload`),
and handed to the device as a typed :class:`~device_bridge.Job`. While the edit runs, the device's
events are folded into an :class:`~device_bridge.EditProgress` (the runtime's own timeline) and drawn
live; when it ends the page shows the output beside the FP16-reference output, the metrics, a
difference heat-map, the latency breakdown and what left the device. Every failure becomes a line in
the status box (and a toast for input problems), never a traceback.
"""

from __future__ import annotations

import contextlib
import html
import random
import time
from dataclasses import replace

import gradio as gr
from PIL import Image

from app.device import COMPARE_ORDER, SYSTEM_TITLES, EditRun
from app.edit_inputs import check_trace_upload, network_spec
from app.edit_panels import (
    COMPARE_HEADERS,
    PRIVACY_HEADERS,
    backends_line,
    compare_rows,
    device_panel_html,
    machine_note,
    metrics_html,
    privacy_html,
    privacy_rows,
    status_html,
    what_ran,
)
from app.images import UploadError, diff_heatmap, from_b64
from app.timeline import latency_figure, timeline_figure
from device_bridge import FLOOR, OURS, EditProgress, EditRejected, Job, NetworkSpec, Photo

TASK_TITLES = {"fs": "Face swap", "vton": "Virtual try-on", "mb": "Text edit"}
NETWORKS = [("5G (mmWave, walking)", "5g"), ("4G + 5G (mixed)", "4g5g"), ("Wi-Fi 6", "wifi"),
            ("Fixed rate", "fixed"), ("Upload a trace file", "upload")]
SYSTEM_CHOICES = [(title, name) for name, title in SYSTEM_TITLES.items()] + [("Compare all (same trace start)", "all")]
MAX_PROMPT = 2000
TRACE_HORIZON_S = 600.0
# The live timeline is drawn from this far into an edit, this often: a browser takes 0.3-1.5 s to draw it here and
# holds the next update meanwhile, so an edit shorter than that shows its live status line and its plot at the end.
LIVE_PLOT_AFTER_S, LIVE_PLOT_EVERY_S = 1.5, 0.5
__all__ = ["EditPage", "check_trace_upload", "network_spec"]


def _esc(x) -> str:
    return html.escape(str(x))


class EditPage:
    """Builds the edit tab inside the current ``gr.Blocks``; talks to ``bridge`` only."""

    def __init__(self, bridge, templates: list[dict], builds=None, device: dict | None = None, calibrations=None):
        """``builds``: packs still building in the background (``ready(id)``, ``status(id)``,
        ``prioritize(id)``, ``summary()``), or None. ``device``: the device's backends (its health's
        ``backends``: executor, reconstructor, where they run). ``calibrations``: the device's compute
        calibrated per template behind the page (:class:`app.calibrations.Calibrations`), or None."""
        self.bridge, self.builds, self.device, self.calibrations = bridge, builds, device, calibrations
        self.templates = templates
        self.by_id = {t["id"]: t for t in templates}

    def _ready(self, tid: str | None) -> bool:
        if self.builds is not None and tid:
            return self.builds.ready(tid)
        return (self.by_id.get(tid) or {}).get("available") is not False

    def build_status(self) -> str:
        """One line on the background builds and calibrations (empty when there are none left)."""
        parts, kind = [], "run"
        if self.builds is not None:
            s = self.builds.summary()
            if not s["done"] or s["failed"]:
                parts.append(f"Preparing templates: {s['ready']}/{s['total']} ready")
                if s["current"]:  # (a template being priced is usable: its levels keep the pack's own errors)
                    doing = "measuring the level prices of" if s.get("pricing") else "building"
                    parts.append(f"{doing} {s['current']} ({s['stage']})")
                if s["failed"]:
                    parts.append("failed: " + ", ".join(s["failed"]))
                    kind = "warn" if s["done"] else kind
        if self.calibrations is not None:
            c = self.calibrations.summary()
            if c["ready"] < c["total"]:
                parts.append(f"device compute calibrated for {c['ready']}/{c['total']}"
                             + (f", calibrating {c['current']}" if c["current"] else ""))
            if c["failed"]:
                parts.append("calibration failed: " + ", ".join(c["failed"]))
        return status_html(" · ".join(parts), kind) if parts else ""

    # ------------------------------------------------------------------------------------ layout
    def _inputs(self) -> dict:
        """The four input steps; returns the components by name."""
        ids = [t["id"] for t in self.templates]
        default = next((t["id"] for t in self.templates if self._ready(t["id"])), ids[0] if ids else None)
        photo_state = gr.State(None)  # the checked Photo: stays in this process, goes only to the device
        trace_state = gr.State(None)  # the checked TraceUpload
        runs_state = gr.State({})  # system -> EditProgress of its run

        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                # (callable values: computed at each page load, not when the app started)
                builds = gr.HTML(self.build_status, elem_id="build-status")
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
                template_info = gr.HTML(lambda: self._template_info(default), elem_id="template-info")
            with gr.Column(scale=2, min_width=340):
                gr.Markdown("### 2 · Your input")
                photo = gr.File(label="Your photo (PNG or JPEG) — stays on the device", file_count="single",
                                type="filepath", elem_id="photo-upload", height=110)
                preview = gr.Image(label="Photo the device will use", type="pil", interactive=False, height=160,
                                   elem_id="photo-preview", visible=self._task(default) != "mb")
                prompt = gr.Textbox(
                    label="Instruction — stays on the device",
                    placeholder="e.g. make it a red sports car",
                    lines=2,
                    max_lines=4,
                    elem_id="prompt",
                    visible=self._task(default) == "mb",
                )
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
                system = gr.Radio(SYSTEM_CHOICES, value=OURS, label="System", elem_id="system")
                prefetch = gr.Checkbox(value=True, elem_id="use-prefetch",
                                       label="Prefetch: start downloading a template's cache when it is picked "
                                       "(a single SAKURA run uses it; Compare all never does)")
                sim_baselines = gr.Checkbox(value=True, elem_id="sim-baselines",
                                            label="Compare all: baselines on the simulated clock (their calibrated "
                                            "compute and the trace's integral; SAKURA always runs on the real clock)")
                run = gr.Button("Run edit", variant="primary", elem_id="run-btn")
        return dict(
            builds=builds,
            galleries=galleries,
            template=template,
            template_info=template_info,
            photo=photo,
            preview=preview,
            prompt=prompt,
            network=network,
            fixed=fixed,
            start=start,
            trace_file=trace_file,
            regime=regime,
            system=system,
            prefetch=prefetch,
            sim_baselines=sim_baselines,
            run=run,
            photo_state=photo_state,
            trace_state=trace_state,
            runs_state=runs_state,
        )

    def _outputs(self, runs_state) -> None:
        """The results area: status, live timeline, images, metrics, comparison, privacy."""
        device_panel = gr.HTML(device_panel_html(self.device), elem_id="device-panel")
        status = gr.HTML(status_html("Pick a template, give it a photo (or an instruction), and run."),
                         elem_id="status")
        timeline = gr.Plot(timeline_figure(EditProgress(system="—"), "live timeline (waiting for an edit)"),
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

        self._c = dict(device_panel=device_panel, status=status, timeline=timeline, out_img=out_img, ref_img=ref_img,
                       diff_img=diff_img,
                       metrics=metrics, latency=latency, compare=compare, outputs_gallery=outputs_gallery,
                       privacy=privacy, privacy_table=privacy_table, view=view, runs_state=runs_state)


    def build(self) -> None:
        c = self._inputs()
        self._outputs(c["runs_state"])
        galleries, template, template_info, photo, preview, prompt = (c[k] for k in (
            "galleries", "template", "template_info", "photo", "preview", "prompt"))
        network, fixed, start, trace_file, regime, system, prefetch, sim_baselines, run = (c[k] for k in (
            "network", "fixed", "start", "trace_file", "regime", "system", "prefetch", "sim_baselines", "run"))
        photo_state, trace_state, runs_state = c["photo_state"], c["trace_state"], c["runs_state"]
        status = self._c["status"]
        if self.builds is not None or self.calibrations is not None:  # work behind the page: its progress
            gr.Timer(2.0).tick(lambda tid: (self.build_status(), self._template_info(tid)), template,
                               [c["builds"], template_info], show_progress="hidden", queue=False)
        for g, gids in galleries:
            g.select(self._picker(gids), None, template, show_progress="hidden", queue=False)
        template.change(
            self.on_template,
            [template, network, fixed, trace_state, start, regime, prefetch, photo_state],
            [template_info, preview, prompt, photo, photo_state, status, self._c["device_panel"]],
            show_progress="hidden",
            queue=False,
        )
        photo.upload(self.on_photo, photo, [preview, photo_state, status, photo], show_progress="minimal")
        photo.clear(lambda: (None, None, status_html("Photo removed.")), None, [preview, photo_state, status],
                    queue=False)
        network.change(self.on_network, network, [fixed, trace_file, regime], queue=False, show_progress="hidden")
        trace_file.upload(self.on_trace, trace_file, [trace_state, status, trace_file], show_progress="minimal")
        trace_file.clear(lambda: (None, status_html("Trace file removed.")), None, [trace_state, status], queue=False)
        outs = [self._c[k] for k in ("device_panel", "status", "timeline", "out_img", "ref_img", "diff_img", "metrics",
                                     "latency", "compare", "outputs_gallery", "privacy", "privacy_table", "view",
                                     "runs_state")]
        run.click(
            self.run,
            [template, photo_state, prompt, network, fixed, trace_state, start, regime, system, prefetch,
             sim_baselines],
            outs,
            show_progress="minimal",
            concurrency_limit=1,
            concurrency_id="device",
        )
        view = self._c["view"]
        view.change(self.on_view, [view, runs_state, photo_state, prompt, template],
                    [self._c[k] for k in ("timeline", "out_img", "ref_img", "diff_img", "metrics", "privacy",
                                          "privacy_table", "device_panel")], show_progress="hidden", queue=False)

    # ------------------------------------------------------------------------------- handlers
    def _caption(self, t: dict) -> str:
        title = str(t.get("title") or t["id"]).split(",")[0]
        title = title if len(title) <= 26 else title[:25] + "…"
        cap = f"{title} · mask {t.get('mask_ratio', 0):.0%}"
        if t.get("available") is False and self.builds is None:  # while builds run, the status line says it
            cap += " · packs not built"
        return cap

    def _task(self, tid: str | None) -> str:
        return (self.by_id.get(tid) or {}).get("task", "fs")

    def _template_info(self, tid: str | None) -> str:
        t = self.by_id.get(tid)
        if not t:
            return "<div class='sk-tinfo'>No template selected.</div>"
        need = "an instruction" if t["task"] == "mb" else ("a face photo" if t["task"] == "fs" else "a garment photo")
        if self.builds is not None and not self.builds.ready(tid):
            avail = f" <b class='sk-warn'>Its packs are not ready yet ({_esc(self.builds.status(tid))}).</b>"
        else:
            avail = "" if self._ready(tid) else " <b class='sk-warn'>Its packs are not on the template server.</b>"
        calibration = self.calibrations.status(tid) if self.calibrations is not None else ""
        if calibration and not self.calibrations.ready(tid):
            avail += f" Device compute: {_esc(calibration)} (a Run now measures it first)."
        planned = t.get("backends")
        runs_on = (f" Runs on {_esc(backends_line(planned))} (host CPU)"
                   + (f": {_esc(planned['note'])}." if planned.get("note") else ".")) if planned else ""
        return (f"<div class='sk-tinfo'><b>{_esc(t.get('title') or t['id'])}</b> · <code>{_esc(t['id'])}</code> · "
                f"{_esc(TASK_TITLES.get(t['task'], t['task']))} · model {_esc(t.get('model', ''))} · "
                f"mask {t.get('mask_ratio', 0):.1%} of pixels, {t.get('token_ratio', 0):.1%} of tokens · "
                f"needs {need}.{avail}{runs_on}</div>")

    @staticmethod
    def _picker(gids: list[str]):
        def pick(evt: gr.SelectData):
            i = evt.index if isinstance(evt.index, int) else (evt.index[0] if evt.index else 0)
            return gids[i] if 0 <= i < len(gids) else gr.update()

        return pick

    def on_template(self, tid, network=None, fixed=None, trace_up=None, start=None, regime=True, prefetch=False,
                    photo=None):
        """A pick keeps the photo already uploaded (a pick that registers after the upload must not lose it);
        a text edit only hides it."""
        if self.builds is not None and tid:
            self.builds.prioritize(tid)  # the template the user wants is built next
        if self.calibrations is not None and tid:
            self.calibrations.prioritize(tid)  # and calibrated next
        task = self._task(tid)
        photo_task = task != "mb"
        fetching = self._prefetch(tid, network, fixed, trace_up, start, regime) if prefetch else ""
        kept = photo is not None and photo_task
        ask = ("type an instruction." if not photo_task else "your photo is kept." if kept else "upload a photo.")
        preview = gr.update(visible=photo_task, value=Image.fromarray(photo.pixels) if kept else None)
        return (self._template_info(tid), preview, gr.update(visible=not photo_task), gr.update(visible=photo_task),
                photo, status_html(f"Template {tid} selected: {ask}{fetching}"),
                device_panel_html(self.device, template=self.by_id.get(tid)))

    def _prefetch(self, tid, network, fixed, trace_up, start, regime) -> str:
        """Picking a template starts its pack downloading (template data only) while the person picks a
        photo; the status line says so. A prefetch that cannot start costs nothing: the edit streams it all."""
        if not tid or not self._ready(tid) or network is None:
            return ""
        try:
            self.bridge.prefetch(tid, network_spec(network, fixed, trace_up, start, bool(regime)))
        except Exception:  # noqa: BLE001 - e.g. an unparsable trace: the edit reports it
            return ""
        return " Its cache is downloading meanwhile (template data only)."

    def on_photo(self, path):
        try:
            photo = Photo.from_file(path) if path else None
            msg = None if photo else "Please upload a photo first (PNG or JPEG)."
        except EditRejected as e:  # one line from the protocol's checker, made a sentence for the page
            photo, msg = None, f"{str(e)[:1].upper()}{str(e)[1:]}."
        if photo is None:
            gr.Warning(msg)
            return None, None, status_html(msg, "warn"), None
        return (Image.fromarray(photo.pixels), photo,
                status_html("Photo ready (centre square); it stays on the device.", "ok"), gr.update())

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
        return tr, status_html(f"Trace ready: {tr.summary()}. The device emulates it (it is not sent to the "
                               "template server).", "ok"), gr.update()

    # ------------------------------------------------------------------------------------ run
    def _validate(self, tid, photo: Photo | None, prompt) -> tuple[str, Photo | None]:
        t = self.by_id.get(tid)
        if not t:
            raise UploadError("Please pick a template first.")
        if not self._ready(tid) and self.builds is not None:
            self.builds.prioritize(tid)
            raise UploadError(f"Template {tid} is not ready yet ({self.builds.status(tid)}); it is being prepared "
                              "first now — try again in a minute, or pick a ready template.")
        if not self._ready(tid):
            raise UploadError(f"Template {tid} has no packs on the template server yet; build them with "
                              f"`sakura build --templates {tid}` or pick another template.")
        if t["task"] == "mb":
            text = (prompt or "").strip()
            if not text:
                raise UploadError("Please type an instruction for this text edit (the prompt is empty).")
            if len(text) > MAX_PROMPT:
                raise UploadError(f"The instruction is too long ({len(text)} characters; at most {MAX_PROMPT}).")
            return text, None
        if photo is None:
            what = "a face photo" if t["task"] == "fs" else "a photo of a garment"
            raise UploadError(f"Please upload {what} first (PNG or JPEG).")
        return "", photo

    def run(self, tid, photo, prompt, network, fixed, trace_up, start, regime, system, prefetch=True,
            sim_baselines=True):
        try:
            text, photo = self._validate(tid, photo, prompt)
            net = network_spec(network, fixed, trace_up, start, bool(regime))
        except UploadError as e:
            gr.Warning(str(e))
            yield self._o("status", status_html(str(e), "warn"))
            return
        systems = list(COMPARE_ORDER) if system == "all" else [system]
        if len(systems) > 1 and net.start is None:  # one start for every system
            net = NetworkSpec(net.trace, round(random.uniform(0.0, TRACE_HORIZON_S), 1), net.scale, net.regime,
                              net.upload)
        runs: dict[str, EditProgress] = {}
        yield self._reset_outputs(len(systems) > 1)
        jobs = {name: Job(tid, name, text, photo, net, prefetch=bool(prefetch) and len(systems) == 1,
                          clock="sim" if len(systems) > 1 and sim_baselines and name != OURS else "real")
                for name in systems}  # prefetched bytes only for a single SAKURA run: Compare all stays comparable
        # a measured run never shares the CPU with the demo's background pack builds: they hold meanwhile
        with self.builds.paused() if self.builds is not None else contextlib.nullcontext():
            stopped = yield from self._run_systems(jobs, photo is not None, bool(text), runs)
            if runs and not stopped:
                for said in self._check_machine(jobs, runs):
                    yield self._o("status", status_html(said, "run"))
        if runs and not stopped:  # (a single run's pictures and metrics come with its summary, in one update)
            rendered = {} if len(systems) > 1 else self._render(runs[systems[0]], photo is not None, bool(text))
            yield {**rendered, **self._final(runs, len(systems) > 1)}

    def _run_systems(self, jobs: dict[str, Job], had_photo: bool, had_prompt: bool, runs: dict):
        """Each system's edit in turn, filling ``runs``; returns True when a problem ended them early."""
        for k, (name, job) in enumerate(jobs.items()):
            prefix = f"[{k + 1}/{len(jobs)}] " if len(jobs) > 1 else ""
            progress = EditProgress(system=SYSTEM_TITLES[name])
            edit = EditRun(self.bridge, job).start()
            shown = False  # the output is on the page (before its reference and metrics: a single run)
            started = drawn = time.monotonic()
            for batch in edit.events():
                for ev in batch:
                    progress.apply(ev)
                if shown:  # (the page already says Done; the result's update follows)
                    continue
                if len(jobs) == 1 and progress.output is not None and progress.result is None:
                    shown = True
                    yield self._render_output(progress, name)
                    continue
                live = {**self._o("status", status_html(prefix + progress.status_line(), "run"))}
                now = time.monotonic()
                if now - started >= LIVE_PLOT_AFTER_S and now - drawn >= LIVE_PLOT_EVERY_S:
                    live.update(self._o("timeline", timeline_figure(progress)))
                    drawn = now
                yield live
            if edit.problem is not None:
                problem = edit.problem
                if problem.user_fixable:
                    gr.Warning(problem.friendly)
                msg = prefix + f"{SYSTEM_TITLES[name]}: {problem.friendly}"
                yield self._o("status", status_html(msg, "warn" if problem.user_fixable else "error"))
                if problem.user_fixable or len(jobs) == 1:
                    return True
                continue
            runs[name] = progress
            if len(jobs) > 1 and (name == OURS or len(runs) == 1):
                yield self._render(progress, had_photo, had_prompt)
        return False

    def _render_output(self, progress: EditProgress, name: str) -> dict:
        """The edit is done: its picture now; its timeline, reference and metrics when the result comes (a
        redrawn plot would hold the picture back by its drawing time)."""
        out = progress.output or {}
        follows = " Computing the FP16-reference output for comparison…" if out.get("reference_follows") else ""
        return {**self._o("status", status_html(self._done_line(name, progress, out.get("summary") or {})
                                                + follows, "run")),
                **self._o("out_img", gr.update(value=from_b64(out.get("image_png_b64")),
                                               label=f"Output — {progress.system}"))}

    @staticmethod
    def _done_line(name: str, progress: EditProgress, s: dict) -> str:
        return (f"Done: {what_ran(name, progress.timeline.fallbacks)} finished in {s.get('latency_s', 0):.3f} s "
                f"({s.get('stall_s', 0):.3f} s stalled), {s.get('bytes', 0) / 1e6:.2f} MB sent.")

    def _check_machine(self, jobs: dict[str, Job], runs: dict[str, EditProgress]):
        """A real-clock latency measures the machine too. Each run whose compute left its calibration's spread,
        or that came out below the oracle's floor, gets the same job's simulated-clock latency beside it
        (marked on its result, which the table and status show). Yields a status line for each."""
        floor = (runs[FLOOR].result or {}).get("summary", {}).get("latency_s") if FLOOR in runs else None
        for name, progress in runs.items():
            res = progress.result or {}
            s = res.get("summary") or {}
            if s.get("clock") != "real" or name == FLOOR:
                continue
            if floor is not None and (s.get("latency_s") or 0) < floor:
                res["below_floor"] = floor
            if (s.get("compute_check") or {}).get("busy") or res.get("below_floor"):
                why = ("its compute left its calibration's spread" if (s.get("compute_check") or {}).get("busy")
                       else "it came out below the oracle's floor")
                yield f"{SYSTEM_TITLES[name]}: {why}; running it on the simulated clock too…"
                sim = EditRun(self.bridge, replace(jobs[name], clock="sim", reference_output=False,
                                                   prefetch=False)).start()
                for _ in sim.events():
                    pass
                res["sim_latency_s"] = ((sim.result or {}).get("summary") or {}).get("latency_s")
                res["sim_without_prefetch"] = jobs[name].prefetch

    def _final(self, runs: dict[str, EditProgress], compare: bool) -> dict:
        results = {name: progress.result for name, progress in runs.items()}
        out = {}
        lat_rows = [{**(r.get("summary") or {}), "system": SYSTEM_TITLES[s]} for s, r in results.items()]
        out.update(self._o("latency", gr.update(value=latency_figure(lat_rows), visible=True)))
        fired = {name: progress.timeline.fallbacks for name, progress in runs.items()}
        if compare:
            out.update(self._o("compare", gr.update(value=compare_rows(results, fired), visible=True)))
            out.update(self._o("outputs_gallery", gr.update(
                value=[(from_b64(r.get("image_png_b64")), what_ran(s, fired[s])) for s, r in results.items()],
                visible=True)))
        shown = OURS if OURS in results else next(iter(results))
        out.update(self._o("view", gr.update(choices=[(SYSTEM_TITLES[s], s) for s in results], value=shown,
                                             visible=len(results) > 1)))
        out.update(self._o("runs_state", runs))
        s = results[shown].get("summary") or {}
        fell = [what_ran(n, f) for n, f in fired.items() if f]
        done = (f"Done: {len(results)} system{'s' if len(results) > 1 else ''} ran"
                + (f"; fell back: {'; '.join(fell)}. " if fell else ". ") if compare else
                self._done_line(shown, runs[shown], s))
        notes = {n: note for n, r in results.items() if (note := machine_note(r))}
        if notes:
            flagged = ", ".join(SYSTEM_TITLES[n] for n in notes)
            done += (f" Measured on a busy machine or below the oracle's floor: {flagged} (see the note column; "
                     "the measured figure stays beside the simulated one)." if compare
                     else f" Note: {notes[shown]}." if shown in notes else "")
        out.update(self._o("status", status_html(done, "warn" if notes else "ok")))
        return out

    def on_view(self, name, runs, photo, prompt, tid):
        progress = (runs or {}).get(name)
        if progress is None:
            return (gr.update(),) * 8
        r = self._render(progress, self._task(tid) != "mb", self._task(tid) == "mb")
        keys = ["timeline", "out_img", "ref_img", "diff_img", "metrics", "privacy", "privacy_table", "device_panel"]
        return tuple(r[self._c[k]] for k in keys)

    # ------------------------------------------------------------------------------- helpers
    def _render(self, progress: EditProgress, had_photo: bool, had_prompt: bool) -> dict:
        res = progress.result or {}
        out_im, ref_im = from_b64(res.get("image_png_b64")), from_b64(res.get("reference_png_b64"))
        mask = from_b64(res.get("mask_png_b64"))
        diff = diff_heatmap(out_im, ref_im, mask) if out_im is not None and ref_im is not None else None
        return {**self._o("timeline", timeline_figure(progress, f"timeline — {progress.system} (finished)")),
                **self._o("out_img", gr.update(value=out_im, label=f"Output — {progress.system}")),
                **self._o("ref_img", ref_im), **self._o("diff_img", diff),
                **self._o("metrics", metrics_html(res)),
                **self._o("device_panel", device_panel_html(self.device, res.get("backends"),
                                                            self.by_id.get(res.get("template_id")))),
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
