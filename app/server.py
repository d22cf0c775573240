"""One FastAPI process: our static files, a health route, and the Gradio UI mounted at ``/``.

>>> app = create_app(bridge, data_dir="runs/app", explorer=Explorer("packs", "runs/app/explorer"))
>>> srv = start_app(app, port=0); print(srv.url); ...; srv.stop()      # start_app: app/cli.py

The app reaches the device only through ``bridge``; the quality explorer (which decodes packs) is
handed in ready-made by ``app/cli.py``, the one module of the app that imports ``sakura``.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402

from app.device import EditProblem, templates_of  # noqa: E402
from app.edit_page import EditPage  # noqa: E402
from app.explorer_page import ExplorerPage  # noqa: E402

STATIC = Path(__file__).resolve().parent.parent / "static"
STATIC_URL = "/sakura-static"
TITLE = "SAKURA — private image editing by streaming template caches"


def _theme():
    system_fonts = ["system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica", "Arial", "sans-serif"]
    return gr.themes.Soft(primary_hue="pink", secondary_hue="slate", neutral_hue="slate", font=system_fonts,
                          font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "monospace"])


def device_note(backends: dict | None) -> str:
    """The header's line on what "device" means here, naming the backends the agent runs."""
    runs = (f"{backends.get('executor_title')} + {backends.get('reconstructor_title')} rebuild"
            if backends else "its configured backends")
    return ("Here the “device” is an agent process on this computer running the masked model on its CPU "
            f"({runs}), over an emulated link shaped by the chosen trace; no phone runs these edits "
            "unless one is attached through the adb transport.")


def _device_backends(bridge) -> dict | None:
    try:
        return bridge.health().get("backends")
    except Exception:  # noqa: BLE001 - an unreachable device says so in the template list
        return None


# The study is an app of its own: the demo's pages never show a participant's answers or the results.
STUDY_NOTE = ("<div class='sk-status sk-info'>The blind user study runs as its own app, apart from this demo, so that "
              "participants see nothing but the study and no one here sees their answers: "
              "<code>sakura study serve</code> (participants' pages; results and exports on a separate operator "
              "page behind a token), <code>sakura study report</code> (the share judged similar per system against "
              "bytes and masked PSNR).</div>")


def build_blocks(bridge, *, data_dir: str | Path, explorer=None, builds=None, calibrations=None,
                 offered: list[str] | None = None) -> gr.Blocks:
    """``builds``: the background pack builds (``sakura.offline.build_queue.BuildQueue``), or None when
    every pack is there already; ``calibrations``: the device compute calibrated behind the page
    (:class:`app.calibrations.Calibrations`), or None. ``offered``: the template ids the edit page offers
    (``--templates``; None: every template the device lists)."""
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    device = _device_backends(bridge)
    try:
        templates = [t for t in templates_of(bridge) if offered is None or t["id"] in offered]
        problem = None
    except EditProblem as e:
        templates, problem = [], e.friendly
    # delete_cache: uploads and rendered images are removed from the temp folder after 15 min
    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=(300, 900)) as demo:
        gr.HTML(f"""<header class="sk-header"><img src="{STATIC_URL}/sakura.svg" alt="" width="40" height="40">
<div><h1>SAKURA</h1><p>Edit a photo on the device with a diffusion transformer: the template's attention
cache streams from the cloud, compressed to fit the link shard by shard; your photo and your words never leave
the device.</p><p class="sk-device-note" id="sk-device-note">{device_note(device)}</p></div></header>""",
                elem_id="sk-header")
        if problem:
            gr.HTML(f"<div class='sk-status sk-error'>{problem}</div>")
        with gr.Tabs(elem_id="sk-tabs"):
            with gr.Tab("Edit", id="tab-edit", elem_id="tab-edit"):
                if templates:
                    EditPage(bridge, templates, builds, device, calibrations).build()
                else:
                    gr.HTML("<div class='sk-status sk-warn'>The device lists no templates.</div>")
            with gr.Tab("Quality explorer", id="tab-explorer", elem_id="tab-explorer") as explorer_tab:
                if explorer is None:
                    gr.HTML("<div class='sk-status sk-warn'>The quality explorer needs the pack store "
                            "(start the app with --packs).</div>")
                else:
                    ExplorerPage(explorer).build(explorer_tab)
            with gr.Tab("User study", id="tab-study", elem_id="tab-study"):
                gr.HTML(STUDY_NOTE, elem_id="study-note")
    return demo


def create_app(bridge, *, data_dir: str | Path, explorer=None, builds=None, calibrations=None,
               max_file_size: str = "25mb", offered: list[str] | None = None) -> FastAPI:
    """The whole app as one ASGI application (Gradio at ``/``, static files at ``/sakura-static``)."""
    os.environ.setdefault("GRADIO_TEMP_DIR", str(Path(data_dir).resolve() / "gradio-tmp"))
    demo = build_blocks(bridge, data_dir=data_dir, explorer=explorer, builds=builds, calibrations=calibrations,
                        offered=offered)
    demo.queue(default_concurrency_limit=2)
    api = FastAPI(title="SAKURA app", docs_url=None, redoc_url=None, openapi_url=None)

    @api.get("/healthz")
    def healthz() -> dict:
        return {"status": "ok"}

    api.mount(STATIC_URL, StaticFiles(directory=STATIC), name="sakura-static")
    head = (f'<link rel="icon" type="image/svg+xml" href="{STATIC_URL}/sakura.svg">'
            f'<script src="{STATIC_URL}/app.js" defer></script>')
    return gr.mount_gradio_app(api, demo, path="/", theme=_theme(), css_paths=[STATIC / "app.css"], head=head,
                               footer_links=[], run_history=False, max_file_size=max_file_size, show_error=False,
                               ssr_mode=False)
