"""The user-study tab: take part (blind similar / not-similar votes) and results (Table 3 analog)."""

from __future__ import annotations

import base64
import hashlib
import html
import random
from datetime import datetime, timezone

import gradio as gr
from PIL import Image

from app.device import EditProblem
from app.study import Item, StudyError, StudyStore, plan_items
from device_bridge import COMPRESSED, Job, NetworkSpec

DEFAULT_SYSTEMS = COMPRESSED  # the systems whose pictures differ with the link
STUDY_TRACE = "5g"


def workload_of(t: dict) -> str:
    """fs / vton / mb, and mb-sd for the SD3-style model (the paper's four workloads)."""
    if t["task"] == "mb" and "sd3" in str(t.get("model", "")):
        return "mb-sd"
    return t["task"]


def study_workloads(templates: list[dict], requests_per_template: int = 2,
                    only: list[str] | None = None) -> dict[str, list[tuple[str, list[int]]]]:
    out: dict[str, list[tuple[str, list[int]]]] = {}
    for t in templates:
        if t.get("available") is False or (only and t["id"] not in only):
            continue
        n = min(requests_per_template, int(t.get("n_eval") or requests_per_template))
        out.setdefault(workload_of(t), []).append((t["id"], list(range(n))))
    return out


def make_generator(bridge, trace: str = STUDY_TRACE, regime: str = "paper"):
    """``generate(item)`` for :meth:`StudyStore.ensure_candidate`: the template's evaluation request
    (the catalog's input, chosen on the device), edited by the item's system; the trace start is fixed
    per (template, request) so every system of a pair sees the same link."""

    def generate(item: Item) -> dict:
        start = random.Random(hashlib.sha256(f"{item.template_id}|{item.request}".encode()).digest()).uniform(0, 550)
        job = Job(item.template_id, item.system, network=NetworkSpec(trace, round(start, 1), None, regime),
                  catalog_request=item.request)
        try:
            res = bridge.edit(job)
        except Exception as e:  # noqa: BLE001
            raise EditProblem(
                f"the device could not produce this candidate: {' '.join(str(e).split())[:200]}"
            ) from None
        m, s = res.get("metrics") or {}, res.get("summary") or {}
        return {
            "image": base64.b64decode(res["image_png_b64"]),
            "reference": base64.b64decode(res["reference_png_b64"]),
            "psnr": m.get("psnr"),
            "ssim": m.get("ssim"),
            "latency_s": s.get("latency_s"),
            "bytes": s.get("bytes"),
        }

    return generate


def _msg(text: str, kind: str = "info") -> str:
    return f'<div class="sk-status sk-{kind}" role="status">{html.escape(text)}</div>'


class StudyPage:
    def __init__(self, store: StudyStore, generate):
        self.store, self.generate = store, generate

    def build(self) -> None:
        with gr.Tabs():
            with gr.Tab("Take part", id="study-take"):
                gr.Markdown("You will see the **reference** picture and a **candidate**. Answer whether the "
                            "candidate looks *similar* to the reference. There are no right answers; go with your "
                            "first impression. Each answer is saved at once: you can close the page and come back "
                            "with the same id. Keys: **S** similar, **N** not similar.")
                with gr.Row():
                    pid = gr.Textbox(label="Participant id", placeholder="e.g. your initials + a number",
                                     elem_id="study-pid", scale=3, max_length=64)
                    start = gr.Button("Start / resume", variant="primary", elem_id="study-start", scale=1)
                status = gr.HTML(_msg("Enter an id to start."), elem_id="study-status")
                with gr.Row(equal_height=True):
                    ref = gr.Image(label="Reference", type="pil", interactive=False, height=320, elem_id="study-ref")
                    cand = gr.Image(label="Candidate", type="pil", interactive=False, height=320, elem_id="study-cand")
                with gr.Row():
                    yes = gr.Button("Similar", variant="primary", elem_id="vote-similar", interactive=False)
                    no = gr.Button("Not similar", variant="secondary", elem_id="vote-not-similar", interactive=False)
            with gr.Tab("Results", id="study-results") as results_tab:
                gr.Markdown("Share of answers *similar to the FP16-cache reference*, per system and workload "
                            "(the paper's Table 3), with counts and Wilson 95 % confidence intervals.")
                with gr.Row():
                    refresh = gr.Button("Refresh", elem_id="study-refresh")
                    export = gr.Button("Export CSV", elem_id="study-export")
                    prepare = gr.Button("Prepare all candidates now", elem_id="study-prepare")
                header, body = self.store.table_display()
                table = gr.Dataframe(value=body, headers=header, interactive=False, elem_id="study-table", wrap=True)
                info = gr.HTML(self._info(), elem_id="study-info")
                csv_file = gr.File(label="CSV export", interactive=False, elem_id="study-csv")
        cur = gr.State(None)  # {"pid", "item", "shown_at"}
        outs = [status, ref, cand, yes, no, cur]
        # votes must not queue behind someone's edit: their own group (the device agent serialises the
        # edits that generating a missing candidate needs)
        kw = dict(concurrency_limit=8, concurrency_id="study")
        start.click(self.begin, pid, outs, **kw)
        pid.submit(self.begin, pid, outs, **kw)
        yes.click(self.answer_similar, cur, outs, **kw)
        no.click(self.answer_not_similar, cur, outs, **kw)
        refresh.click(self.results, None, [table, info], queue=False)
        results_tab.select(self.results, None, [table, info], queue=False)
        export.click(self.export, None, [csv_file, info])
        prepare.click(self.prepare, None, [info, table], concurrency_limit=1, concurrency_id="study-prepare")

    # ------------------------------------------------------------------------------------ take part
    def begin(self, pid):
        try:
            pid = self.store.check_participant(pid)
        except StudyError as e:
            gr.Warning(str(e))
            yield _msg(str(e), "warn"), None, None, gr.update(interactive=False), gr.update(interactive=False), None
            return
        if not self.store.items:
            msg = ("This study has no questions yet: no template has its packs on the template server. "
                   "Build packs, restart the app, and try again.")
            yield _msg(msg, "warn"), None, None, gr.update(interactive=False), gr.update(interactive=False), None
            return
        yield from self._next(pid, resumed=True)

    def answer_similar(self, cur):
        yield from self.answer(cur, True)

    def answer_not_similar(self, cur):
        yield from self.answer(cur, False)

    def answer(self, cur, similar: bool):
        if not cur:
            msg = "Enter your participant id and press Start first."
            gr.Warning(msg)
            yield _msg(msg, "warn"), gr.update(), gr.update(), gr.update(), gr.update(), cur
            return
        try:
            shown = datetime.fromisoformat(cur["shown_at"])
            secs = (datetime.now(timezone.utc) - shown).total_seconds()
            self.store.vote(cur["pid"], cur["item"], similar, cur["shown_at"], secs)
        except StudyError as e:
            gr.Warning(str(e))
            yield _msg(str(e), "warn"), gr.update(), gr.update(), gr.update(), gr.update(), cur
            return
        yield from self._next(cur["pid"])

    def _next(self, pid: str, resumed: bool = False):
        item, done, total = self.store.next_item(pid)
        off = gr.update(interactive=False)
        if item is None:
            yield (
                _msg(f"All {total} answered — thank you, {pid}! Your answers are saved.", "ok"),
                None,
                None,
                off,
                off,
                None,
            )
            return
        cand = self.store.candidate(item)
        if cand is None:
            yield (_msg(f"Preparing picture {done + 1} of {total} on the device (first time only)…", "run"),
                   gr.update(), gr.update(), off, off, None)
            try:
                cand = self.store.ensure_candidate(item, self.generate)
            except Exception as e:  # noqa: BLE001
                msg = e.friendly if isinstance(e, EditProblem) else f"{type(e).__name__}: {e}"
                yield (_msg(f"Could not prepare this picture: {msg}. Press Start / resume to try again.", "error"),
                       None, None, off, off, None)
                return
        on = gr.update(interactive=True)
        lead = f"Welcome back, {pid}: " if resumed and done else ""
        yield (_msg(f"{lead}picture {done + 1} of {total}. Is the candidate similar to the reference?", "info"),
               Image.open(cand.reference).convert("RGB"), Image.open(cand.image).convert("RGB"), on, on,
               {"pid": pid, "item": item.key, "shown_at": datetime.now(timezone.utc).isoformat()})

    # ------------------------------------------------------------------------------------- results
    def _info(self) -> str:
        votes = self.store.votes()
        people = len({v["participant"] for v in votes})
        missing = len(self.store.missing_candidates())
        return (f"<div class='sk-status sk-info'>{len(votes)} answers from {people} participant"
                f"{'s' if people != 1 else ''}; {len(self.store.items)} questions per participant "
                f"({len(self.store.items) - missing} pictures prepared).</div>")

    def results(self):
        header, body = self.store.table_display()
        return gr.update(value=body, headers=header), self._info()

    def export(self):
        path = self.store.export_csv()
        return str(path), _msg(f"Exported {path.name}.", "ok")

    def prepare(self, progress=gr.Progress()):
        todo = self.store.missing_candidates()
        failed = 0
        for i, item in enumerate(todo):
            progress(i / max(1, len(todo)), desc=f"candidate {i + 1}/{len(todo)}: {item.template_id} #{item.request}")
            try:
                self.store.ensure_candidate(item, self.generate)
            except Exception:  # noqa: BLE001 - counted and reported below
                failed += 1
        header, body = self.store.table_display()
        note = f" ({failed} failed; see the device)" if failed else ""
        return _msg(f"{len(todo) - failed} candidates prepared{note}.", "warn" if failed else "ok"), \
            gr.update(value=body, headers=header)


def make_store(folder, templates: list[dict], systems=DEFAULT_SYSTEMS, requests_per_template: int = 2,
               only: list[str] | None = None) -> StudyStore:
    return StudyStore(folder, plan_items(study_workloads(templates, requests_per_template, only), systems))
