"""Build missing template packs in the background, one template at a time, while the app serves.

A fresh clone has no packs; building them all takes minutes, so the demo serves its page at once and
a :class:`BuildQueue` builds the packs behind it, in catalog order, the template the user picks first
(:meth:`BuildQueue.prioritize`). The page reads :meth:`BuildQueue.status` and :meth:`BuildQueue.summary`.

The packs go to a pack store (:mod:`sakura.net.stores`): the demo's folder or ``s3://bucket/prefix``.
Write first, publish after: each template is built into a staging folder (``PACKS/.staging/<id>/`` for a
folder, a temporary one otherwise) and then published with :meth:`Store.publish` — renamed in, the main
pack (``<id>.pack``) last, for a folder; uploaded as content-addressed objects and made visible by one
index PUT for S3 — so a reader never sees a half-built template as available.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable

from sakura.formats import FORMATS, file_id
from sakura.net.client import FetchError
from sakura.net.stores import FolderStore, Store, StoreError, open_store
from sakura.offline.builder import build_template
from sakura.offline.publish import BuildSettings

STAGING_DIR_NAME = ".staging"
MAX_FAILURE_MESSAGE_CHARS = 200


def pack_paths(packs_dir: Path, template_id: str) -> list[Path]:
    """The stored file of every format for one template (``<file id>.pack``)."""
    return [packs_dir / f"{file_id(template_id, name)}.pack" for name in FORMATS]


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return text[:MAX_FAILURE_MESSAGE_CHARS]


class BuildQueue:
    """One daemon worker that builds every template whose packs are missing; thread-safe.

    ``store``: a :class:`~sakura.net.stores.Store`, or a folder path / ``s3://`` URL to open (created if
    missing)."""

    def __init__(self, templates: list, store: Store | str | Path, *, build: Callable = build_template,
                 settings: BuildSettings = BuildSettings()):
        self.templates = list(templates)
        self.store = store if isinstance(store, Store) else open_store(store, create=True)
        self.build, self.settings = build, settings
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting: list = []  # templates still to build, front first
        self._current = None  # the template being built
        self._stage = ""
        self._failed: dict[str, str] = {}
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None
        self._pauses = 0  # measured runs under way: the build holds at its next progress report

    # ------------------------------------------------------------------------------------ control
    def start(self) -> "BuildQueue":
        """Queue every template whose packs are missing (catalog order) and start the worker."""
        missing = [t for t in self.templates if not self.ready(t.id)]
        with self._lock:
            if self._worker is not None:
                return self
            self._waiting = missing
            self._worker = threading.Thread(target=self._run, name="sakura-build-queue", daemon=True)
        self._worker.start()
        return self

    def prioritize(self, template_id: str) -> None:
        """Build this template next if it is still waiting; a build in progress is not interrupted."""
        with self._lock:
            for position, template in enumerate(self._waiting):
                if template.id == template_id:
                    self._waiting.insert(0, self._waiting.pop(position))
                    return

    @contextlib.contextmanager
    def paused(self):
        """Hold the build at its next progress report (one per pack shard, about a second) while a measured
        run — an edit, a calibration — has the CPU; nests; :meth:`stop` releases it."""
        with self._changed:
            self._pauses += 1
        try:
            yield self
        finally:
            with self._changed:
                self._pauses -= 1
                self._changed.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is waiting or building (or the worker has stopped); False on timeout."""
        with self._changed:
            return self._changed.wait_for(self._is_idle, timeout)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Build nothing more and wait (up to ``timeout`` s) for the worker to end; the build in
        progress, if any, cannot be interrupted: past the timeout it finishes in the (daemon) thread."""
        self._stopping.set()
        with self._changed:
            self._waiting.clear()
            self._changed.notify_all()  # (a build held by paused() goes on, to its end)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout)

    # ------------------------------------------------------------------------------------ queries
    def ready(self, template_id: str) -> bool:
        """Every stored format's file of this template is published in the store (False while the store
        cannot be read: the page keeps working and says "waiting"). Never called with the lock held: an
        object store answers over the network."""
        try:
            return self.store.has_template(template_id)
        except (StoreError, FetchError):
            return False

    def status(self, template_id: str) -> str:
        """``ready`` | ``waiting`` | ``building: <stage>`` | ``failed: <one line>``."""
        with self._lock:
            if self._current is not None and self._current.id == template_id:
                return f"building: {self._stage}"
            if template_id in self._failed:
                return f"failed: {self._failed[template_id]}"
        return "ready" if self.ready(template_id) else "waiting"

    def summary(self) -> dict:
        ready = sum(self.ready(t.id) for t in self.templates)
        with self._lock:
            return {"ready": ready, "total": len(self.templates),
                    "current": self._current.id if self._current is not None else None, "stage": self._stage,
                    "failed": dict(self._failed), "done": self._is_idle()}

    # ------------------------------------------------------------------------------------ worker
    def _is_idle(self) -> bool:  # call with the lock held
        worker_gone = self._worker is None or not self._worker.is_alive()
        return self._current is None and (not self._waiting or worker_gone)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                with self._changed:
                    if not self._waiting:
                        break
                    template = self._current = self._waiting.pop(0)
                    self._stage = "starting"
                    self._changed.notify_all()
                try:
                    self._build_and_publish(template)
                except Exception as error:  # noqa: BLE001 - one template failing must not stop the others
                    with self._lock:
                        self._failed[template.id] = one_line(error)
                with self._changed:
                    self._current, self._stage = None, ""
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._current = None
                self._changed.notify_all()

    def _report_stage(self, stage: str) -> None:
        with self._changed:
            self._stage = str(stage)
            if self._pauses and not self._stopping.is_set():
                self._stage = f"{stage} (paused while an edit runs)"
                while self._pauses and not self._stopping.is_set():
                    self._changed.wait(0.5)
                self._stage = str(stage)

    def _build_and_publish(self, template) -> None:
        if isinstance(self.store, FolderStore):  # same file system: publishing is a rename
            staging = self.store.root / STAGING_DIR_NAME / template.id
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        else:
            staging = Path(tempfile.mkdtemp(prefix=f"sakura-build-{template.id}-"))
        try:
            self.build(template, staging, progress=self._report_stage, **self.settings.builder_kw())
            self._report_stage("publishing")
            self.store.publish(template.id, staging, self.settings.key(template))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
