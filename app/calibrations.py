"""Device compute calibrated per template behind the page, as each template's packs become ready, so that no
Run waits on it. The agent measures and keeps it (the bench's calibration store and its spread rule); the
demo's background builds hold while it measures, and a person's edit goes first."""

from __future__ import annotations

import contextlib
import logging
import threading

log = logging.getLogger(__name__)

WAITING, CALIBRATING, READY, FAILED = "waiting for its packs", "calibrating", "calibrated", "calibration failed"


class Calibrations:
    """One background thread over ``template_ids`` (the picked one first): ``bridge.warmup`` each template
    once ``builds.ready`` says its packs are there and the device is not busy with an edit."""

    def __init__(self, bridge, template_ids: list[str], builds=None, poll_s: float = 1.0) -> None:
        self.bridge, self.builds, self.poll_s = bridge, builds, poll_s
        self.state = {tid: WAITING for tid in template_ids}
        self.errors: dict[str, str] = {}
        self._first: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Calibrations":
        self._thread = threading.Thread(target=self._loop, daemon=True, name="calibrations")
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def prioritize(self, template_id: str) -> None:
        self._first = template_id

    def status(self, template_id: str | None) -> str:
        return self.state.get(template_id or "", "")

    def ready(self, template_id: str | None) -> bool:
        return self.status(template_id) == READY

    def summary(self) -> dict:
        return {"ready": sum(s == READY for s in self.state.values()), "total": len(self.state),
                "current": next((t for t, s in self.state.items() if s == CALIBRATING), None),
                "failed": sorted(self.errors)}

    def _next(self) -> str | None:
        """The template to calibrate now: the picked one first, then in order; its packs must be ready."""
        todo = [t for t, s in self.state.items() if s == WAITING]
        if self._first in todo:
            todo.remove(self._first)
            todo.insert(0, self._first)
        return next((t for t in todo if self.builds is None or self.builds.ready(t)), None)

    def _device_busy(self) -> bool:
        try:
            return bool(self.bridge.health().get("busy"))
        except Exception:  # noqa: BLE001 - an unreachable device: the warm-up will say so
            return False

    def _loop(self) -> None:
        while not self._stop.is_set() and any(s == WAITING for s in self.state.values()):
            tid = self._next()
            if tid is None or self._device_busy():
                self._stop.wait(self.poll_s)
                continue
            self.state[tid] = CALIBRATING
            try:  # the builds hold meanwhile: a measurement beside a build would calibrate the build's load
                with self.builds.paused() if self.builds is not None else contextlib.nullcontext():
                    self.bridge.warmup(tid)
                self.state[tid] = READY
            except Exception as e:  # noqa: BLE001 - the page shows it; a Run on it calibrates inside the edit
                log.warning("calibrating %s failed: %s", tid, e)
                self.errors[tid] = " ".join(str(e).split())[:200]
                self.state[tid] = FAILED
