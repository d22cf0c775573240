"""One streamed edit from the Run button to the masked run and back, as a recorded call trace.

Runs the demo's edit page (``app.edit_page.EditPage.run``, what the Run button calls) over an in-process
device agent, records every call between project functions (``sys.setprofile`` in every thread), and
prints the edit's path: the chain of project calls from the Run handler down to the first K/V the model
asks for (through the worker thread the page starts), then the chain that carries the result event back
to the page. A *stop* is a call into another project function on that path; a *climb* is a call from a
lower layer into a higher one (layers, top first: app, device_bridge, sakura.runtime.session, runners,
the stream engine, the model). The same for ``sakura edit --stream`` (``stream_edit``).

    python docs/results/issue29/edit_path.py [--packs PACKS] [--out docs/results/issue29/edit_path.json]
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
PROJECT = tuple(str(ROOT / p) for p in ("app", "device_bridge", "sakura"))
LAYERS = (("app/", 0), ("device_bridge/", 1), ("sakura/runtime/session.py", 2), ("sakura/runtime/runners.py", 3),
          ("sakura/runtime/", 4), ("sakura/model/", 5))


def layer(where: str) -> int:
    return next((rank for prefix, rank in LAYERS if where.startswith(prefix)), 4)


class Recorder:
    """Every project frame's parent, per thread; the stacks at the moments of interest."""

    def __init__(self):
        self.snaps: dict[str, list[str]] = {}

    @staticmethod
    def where(frame) -> str | None:
        path = frame.f_code.co_filename
        if not path.startswith(PROJECT):
            return None
        return f"{Path(path).relative_to(ROOT)}:{frame.f_code.co_qualname}"

    def stack(self, frame) -> list[str]:
        out = []
        while frame is not None:
            w = self.where(frame)
            if w is not None and (not out or out[-1] != w):
                out.append(w)
            frame = frame.f_back
        return out[::-1]

    def profile(self, frame, event, arg):
        if event != "call" or self.where(frame) is None:
            return
        name = frame.f_code.co_qualname
        ev = frame.f_locals.get("ev")
        is_result = isinstance(ev, dict) and ev.get("type") == "result"
        for key, hit in (("start", name == "EditRun.start"), ("provide", name == "StreamedEdit.provide"),
                         ("emit", name == "_Emitter.__call__" and is_result),
                         ("event", name == "DeviceAgent._run.<locals>.on_event"),
                         ("apply", name == "EditProgress.apply" and is_result),
                         ("render", name == "EditPage._render"), ("final", name == "EditPage._final")):
            if hit and key not in self.snaps:
                self.snaps[key] = self.stack(frame)


def inside_the_model(stack: list[str]) -> list[str]:
    """The stack with the masked run's own frames (the model computing, between ``masked_edit`` and the
    callback it makes for K/V) left out: the path ends at the masked run and its provider."""
    cut = next((i for i, f in enumerate(stack) if f.endswith(":DiTAdapter.masked_edit")), None)
    if cut is None:
        return stack
    back = next((i for i, f in enumerate(stack) if i > cut and not f.startswith("sakura/model/")), len(stack))
    return stack[:cut + 1] + stack[back:]


@functools.cache
def functions_of(path: str) -> dict:
    """Every function of a source file by its ``__qualname__``."""
    out = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[prefix + child.name] = child
                visit(child, f"{prefix}{child.name}.<locals>.")

    visit(ast.parse((ROOT / path).read_text()), "")
    return out


def pass_through(where: str) -> bool:
    """A function whose body (past its docstring) is one call, returned or not: it hands the edit on and
    decides nothing (not a stop)."""
    path, qualname = where.split(":")
    node = functions_of(path).get(qualname)
    if node is None:
        return False
    body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    return len(body) == 1 and isinstance(body[0], (ast.Return, ast.Expr)) and isinstance(
        getattr(body[0], "value", None), ast.Call)


def path_of(stacks: list[list[str]], seen: set[str]) -> dict:
    """The stops of ``stacks`` (each a caller→callee chain) not in ``seen``, in order; the climbs among
    their calls."""
    stops, climbs, passing = [], [], []
    for stack in stacks:
        for a, b in zip(stack, stack[1:]):
            if layer(b) < layer(a) and f"{a} → {b}" not in climbs and b not in seen:
                climbs.append(f"{a} → {b}")
        for f in stack:
            if f not in seen:
                seen.add(f)
                (passing if pass_through(f) else stops).append(f)
    return {"stops": stops, "climbs": climbs, "pass_through": passing}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packs", default=str(ROOT / "packs"))
    ap.add_argument("--out", default=str(Path(__file__).with_name("edit_path.json")))
    args = ap.parse_args()

    import gradio as gr
    import numpy as np

    from app.edit_page import EditPage
    from device_bridge import InProcessBridge, Photo
    from sakura.catalog import load_catalog
    from sakura.cli.edit_stream import ensure_packs

    tpl = load_catalog().get("fs-astronaut")
    ensure_packs(args.packs, tpl)
    bridge = InProcessBridge(packs_dir=args.packs)
    with gr.Blocks():
        page = EditPage(bridge, bridge.templates())
        page.build()
    photo = Photo(np.asarray(tpl.image(256) * 255, np.uint8)[..., :3])

    rec = Recorder()
    threading.setprofile(rec.profile)
    sys.setprofile(rec.profile)
    try:  # what the Run button calls: a generator of page updates
        for _ in page.run(tpl.id, photo, "", "fixed", 200.0, None, "0", False, "sakura", False):
            pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    bridge.close()

    # The worker thread's stacks start at EditRun._work; the Run handler's stack at EditRun.start led there.
    seen: set[str] = set()
    report = {"down": path_of([inside_the_model(rec.snaps["start"] + rec.snaps["provide"])], seen),
              "back": path_of([rec.snaps[k] for k in ("event", "emit", "apply", "render", "final")
                               if k in rec.snaps], seen)}
    n_stops = len(report["down"]["stops"]) + len(report["back"]["stops"])
    n_climbs = len(report["down"]["climbs"]) + len(report["back"]["climbs"])
    report["total"] = {"stops": n_stops, "climbs": n_climbs}
    Path(args.out).write_text(json.dumps(report, indent=1))
    for part in ("down", "back"):
        print(f"-- {part}: {len(report[part]['stops'])} stops")
        for f in report[part]["stops"]:
            print("  ", f)
        for f in report[part]["pass_through"]:
            print("   (pass-through, not a stop)", f)
        for c in report[part]["climbs"]:
            print("   climb:", c)
    print(f"total: {n_stops} stops, {n_climbs} climbs → {args.out}")


if __name__ == "__main__":
    main()
