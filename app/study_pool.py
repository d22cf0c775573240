"""The study's candidate pool, prepared behind the page as packs become ready.

For each template whose packs are published and each of its first evaluation requests (the catalog's own;
never an upload), the quality explorer's frontier (:class:`sakura.eval.explorer.Explorer`, handed in by
``app/study_cli.py``: every point a real masked edit whose cache was rebuilt from exactly the bytes that
configuration sends) gives each system's outputs over its byte range. Per system the pool keeps
``budgets`` of them, from its smallest level up to ``max_fraction`` of the FP16 cache (above that every
system is near-lossless and a participant could only answer *similar*), log-spaced in bytes, each the best
masked PSNR within its budget (the explorer's rule). Each unit adds its controls: the reference against itself,
against another template's picture, and against the same request edited on a cache of zeros. Files are copied
into the pool under neutral names and every pair is recorded with its system, budget level, bytes, masked PSNR and SSIM.
"""

from __future__ import annotations

import io
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from PIL import Image

from app.explorer import SYSTEMS_SHOWN, at_budget
from app.study import Candidate, StudyStore


class FrontierSource(Protocol):
    """What the pool needs of the quality explorer."""

    def available(self) -> list[str]: ...

    def frontier(self, template_id: str, request: int, progress=None) -> dict: ...

    def folder(self, template_id: str, request: int) -> Path: ...


@dataclass(frozen=True)
class TemplateInfo:
    id: str
    workload: str  # fs / vton / mb / mb-sd
    n_eval: int  # evaluation requests in the catalog


@dataclass(frozen=True)
class PoolConfig:
    requests: int = 2  # evaluation requests per template
    budgets: int = 4  # levels per system
    max_fraction: float = 0.35  # the largest budget, as a fraction of the FP16 cache bytes


@dataclass
class PoolStatus:
    done: list[str]  # "template#request" prepared
    waiting: list[str]  # templates whose packs are not published yet
    working_on: str | None
    errors: list[str]


def choose_points(data: dict, system: str, config: PoolConfig) -> list[dict]:
    """A system's frontier points for the study: up to ``config.budgets``, smallest bytes first."""
    pts = sorted((p for p in data["points"] if p["system"] == system), key=lambda p: p["bytes"])
    if not pts:
        return []
    cap = max(pts[0]["bytes"], config.max_fraction * data["fp16_bytes"])
    top = max(p["bytes"] for p in pts if p["bytes"] <= cap)
    lo = pts[0]["bytes"]
    k = max(1, config.budgets)
    targets = [lo * (top / lo) ** (i / (k - 1)) if k > 1 else top for i in range(k)]
    out: list[dict] = []
    for b in targets:
        best = at_budget({"points": pts}, b * (1 + 1e-9)).get(system)
        if best is not None and best not in out:
            out.append(best)
    return sorted(out, key=lambda p: p["bytes"])


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


class PoolPreparer:
    """Fills the store's pool from frontiers: ``prepare_once()`` does every unit ready now; ``start()`` keeps
    doing it in a thread, every ``poll_s`` seconds, so templates whose packs are published later join without
    a restart."""

    def __init__(self, store: StudyStore, explorer: FrontierSource, templates: list[TemplateInfo],
                 wrong_image: Callable[[str, int], Image.Image], config: PoolConfig = PoolConfig(),
                 poll_s: float = 10.0, echo: Callable[[str], None] = lambda s: None):
        """``wrong_image(template_id, size)``: a picture of another template than ``template_id`` (the wrong-
        template control), ``size`` pixels square."""
        self.store, self.explorer, self.templates = store, explorer, list(templates)
        self.wrong_image, self.config, self.poll_s, self.echo = wrong_image, config, poll_s, echo
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._status = PoolStatus([], [t.id for t in self.templates], None, [])
        self._lock = threading.Lock()

    def status(self) -> PoolStatus:
        with self._lock:
            s = self._status
            return PoolStatus(list(s.done), list(s.waiting), s.working_on, list(s.errors))

    def prepare_once(self) -> int:
        """Prepare every unit whose packs are published and that is not in the pool yet; returns how many."""
        try:
            available = set(self.explorer.available())
        except Exception as e:  # noqa: BLE001 - no store yet: try again later
            self._error(f"pack store: {' '.join(str(e).split())[:200]}")
            return 0
        have = self.store.units()
        with self._lock:
            self._status.waiting = [t.id for t in self.templates if t.id not in available]
        n = 0
        for t in self.templates:
            if t.id not in available:
                continue
            for r in range(min(self.config.requests, t.n_eval)):
                if self._stop.is_set():
                    return n
                if (t.id, r) in have:
                    self._mark_done(t.id, r)
                    continue
                with self._lock:
                    self._status.working_on = f"{t.id}#{r}"
                try:
                    self.add_unit(t, r)
                    n += 1
                    self._mark_done(t.id, r)
                except Exception as e:  # noqa: BLE001 - one unit failing leaves the others
                    self._error(f"{t.id}#{r}: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
                finally:
                    with self._lock:
                        self._status.working_on = None
        return n

    def add_unit(self, t: TemplateInfo, request: int) -> list[Candidate]:
        """One template + request into the pool: its test pairs and controls (one transaction)."""
        data = self.explorer.frontier(t.id, request)
        folder = self.explorer.folder_of(data)
        ref_png = (folder / data["reference"]).read_bytes()
        reference = self.store.add_image(ref_png)
        size = Image.open(io.BytesIO(ref_png)).size[0]
        fp16 = int(data["fp16_bytes"])
        base = dict(workload=t.workload, template_id=t.id, request=request, fp16_bytes=fp16, reference=reference)
        cands = []
        for system in SYSTEMS_SHOWN:
            for level, p in enumerate(choose_points(data, system, self.config)):
                image = self.store.add_image((folder / p["image"]).read_bytes())
                cands.append(Candidate(id=f"{t.id}#{request}:{system}:{level}", kind="test", system=system,
                                       budget=level, bytes=int(p["bytes"]), config=str(p["config"]),
                                       psnr=_num(p["psnr"]), psnr_masked=_num(p["psnr_masked"]),
                                       ssim=_num(p["ssim"]), ssim_masked=_num(p["ssim_masked"]), image=image, **base))
        wrong = self.store.add_image(_png(self.wrong_image(t.id, size).convert("RGB").resize((size, size))))
        controls = [("identical", reference, {}), ("wrong", wrong, {})]
        if data.get("zeroed"):  # (a frontier cached before the zeroed edit existed has none)
            z = data["zeroed"]
            controls.append(("zeroed", self.store.add_image((folder / z["image"]).read_bytes()),
                             {k: _num(z.get(k)) for k in ("psnr", "psnr_masked", "ssim", "ssim_masked")}))
        for kind, image, q in controls:
            cands.append(Candidate(id=f"{t.id}#{request}:{kind}", kind=kind, system=kind, budget=-1, bytes=0,
                                   config=kind, **({"psnr": None, "psnr_masked": None, "ssim": None,
                                                    "ssim_masked": None} | q), image=image, **base))
        self.store.add_candidates(cands)
        self.echo(f"  study pool: {t.id} request #{request} ready ({len(cands) - len(controls)} pairs + "
                  f"{len(controls)} controls)")
        return cands

    def _mark_done(self, template_id: str, request: int) -> None:
        with self._lock:
            key = f"{template_id}#{request}"
            if key not in self._status.done:
                self._status.done.append(key)

    def _error(self, msg: str) -> None:
        with self._lock:
            self._status.errors = (self._status.errors + [msg])[-10:]
        self.echo(f"  study pool: {msg}")

    # -- background ----------------------------------------------------------------------------------------
    def start(self) -> "PoolPreparer":
        self._thread = threading.Thread(target=self._run, name="study-pool", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.prepare_once()
            wanted = sum(min(self.config.requests, t.n_eval) for t in self.templates)
            if len(self.store.units() & {(t.id, r) for t in self.templates for r in range(t.n_eval)}) >= wanted:
                return  # all there
            self._stop.wait(self.poll_s)

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float) -> bool:
        """Until the thread has prepared everything (tests, ``sakura study prepare``)."""
        end = time.monotonic() + timeout
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < end:
            time.sleep(0.05)
        return self._thread is None or not self._thread.is_alive()


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)
