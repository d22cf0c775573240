"""Build missing template packs in the background, one template at a time, while the app serves.

A fresh clone has no packs; building them all takes minutes, so the demo serves its page at once and
a :class:`BuildQueue` builds the packs behind it, in catalog order, the template the user picks first
(:meth:`BuildQueue.prioritize`). The page reads :meth:`BuildQueue.status` and :meth:`BuildQueue.summary`.

The packs go to a pack store (:mod:`sakura.net.stores`): the demo's folder or ``s3://bucket/prefix``.
Write first, publish after: each template is built into a staging folder (``PACKS/.staging/<id>/`` for a
folder, a temporary one otherwise) and then published with :meth:`Store.publish` — renamed in, the main
pack (``<id>.pack``) last, for a folder; uploaded as content-addressed objects and made visible by one
index PUT for S3 — so a reader never sees a half-built template as available.

Usable first, priced after: measuring every level's output MSE (:mod:`sakura.offline.output_weights`) takes a
few times as long as the rest of a build, so each template is published without it (its header marked pending,
with room for the prices), and once every template is usable the same staged files are measured and published
again, every chunk where it was: a device that read the first header reads the same bytes, prices its levels by
the pack's own errors meanwhile and reads the header again until the prices are there
(:meth:`sakura.runtime.session.DeviceRuntime.encoding`). A template found published unpriced (a demo stopped
mid-way) is priced from its published files, behind the builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sakura.formats import FORMATS, file_id
from sakura.net.client import FetchError
from sakura.net.stores import FolderStore, Store, StoreError, open_store
from sakura.offline.builder import build_template, remeasure_output_weights
from sakura.offline.publish import BuildSettings

STAGING_DIR_NAME = ".staging"
PRICED_SUFFIX = ".pricing"  # a published build's staged files kept for its measurement (hard links)
MAX_FAILURE_MESSAGE_CHARS = 200


def pack_paths(packs_dir: Path, template_id: str) -> list[Path]:
    """The stored file of every format for one template (``<file id>.pack``)."""
    return [packs_dir / f"{file_id(template_id, name)}.pack" for name in FORMATS]


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    return text[:MAX_FAILURE_MESSAGE_CHARS]


@dataclass(frozen=True)
class Job:
    template: object
    kind: str = "build"  # build | price (measure a published build's output MSE, publish it again)
    staged: Path | None = None  # price: the published build's files (None: read them from the store)


class BuildQueue:
    """One daemon worker that builds every template whose packs are missing; thread-safe.

    ``store``: a :class:`~sakura.net.stores.Store`, or a folder path / ``s3://`` URL to open (created if
    missing). ``measure``: what measures a built folder's output weights (None: built with the rest, as
    ``settings`` say)."""

    def __init__(self, templates: list, store: Store | str | Path, *, build: Callable = build_template,
                 measure: Callable | None = remeasure_output_weights, settings: BuildSettings = BuildSettings()):
        self.templates = list(templates)
        self.store = store if isinstance(store, Store) else open_store(store, create=True)
        self.build, self.settings = build, settings
        self.measure = measure if settings.output_weights else None
        self.unpriced = dataclasses.replace(settings, output_weights=False)  # what the first publish is
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiting: list[Job] = []  # still to do, front first
        self._current: Job | None = None  # the job under way
        self._stage = ""
        self._failed: dict[str, str] = {}
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None
        self._pauses = 0  # measured runs under way: the build holds at its next progress report

    # ------------------------------------------------------------------------------------ control
    def start(self) -> "BuildQueue":
        """Queue every template whose packs are missing (catalog order), then those published without their
        output prices, and start the worker."""
        with self._lock:
            if self._worker is not None:
                return self
            self._worker = threading.Thread(target=self._run, name="sakura-build-queue", daemon=True)
        if isinstance(self.store, FolderStore):  # (kept files of pricing that a stopped demo never finished)
            for stale in (self.store.root / STAGING_DIR_NAME).glob(f"*{PRICED_SUFFIX}"):
                shutil.rmtree(stale, ignore_errors=True)
        missing = [Job(t) for t in self.templates if not self.ready(t.id)]
        unpriced = [Job(t, "price") for t in self.templates if self.measure is not None and self.ready(t.id)
                    and self._published_key(t) == self.unpriced.key(t)]
        with self._lock:
            self._waiting = missing + unpriced
        self._worker.start()
        return self

    def prioritize(self, template_id: str) -> None:
        """Build (or price) this template next if it is still waiting; a job in progress is not interrupted."""
        with self._lock:
            for position, job in enumerate(self._waiting):
                if job.template.id == template_id:
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
            dropped, self._waiting = self._waiting, []
            self._changed.notify_all()  # (a build held by paused() goes on, to its end)
        for job in dropped:  # (published already: only its measurement is lost)
            if job.staged is not None:
                shutil.rmtree(job.staged, ignore_errors=True)
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

    def _published_key(self, template) -> str | None:
        try:
            return self.store.published_key(template.id)
        except (StoreError, FetchError):
            return None

    def status(self, template_id: str) -> str:
        """``ready`` | ``waiting`` | ``building: <stage>`` | ``failed: <one line>``; a published template while
        its prices are measured: ``ready; pricing: <stage>``, ``ready; pricing failed: <one line>`` if that failed
        (its levels keep the pack's own errors)."""
        with self._lock:
            if self._current is not None and self._current.template.id == template_id:
                if self._current.kind == "build":
                    return f"building: {self._stage}"
                return f"ready; pricing: {self._stage}"
            failed = self._failed.get(template_id)
        if self.ready(template_id):
            return f"ready; pricing failed: {failed}" if failed else "ready"
        return f"failed: {failed}" if failed else "waiting"

    def summary(self) -> dict:
        ready = sum(self.ready(t.id) for t in self.templates)
        with self._lock:
            job = self._current
            return {"ready": ready, "total": len(self.templates),
                    "current": job.template.id if job is not None else None, "stage": self._stage,
                    "pricing": job is not None and job.kind != "build", "failed": dict(self._failed),
                    "done": self._is_idle()}

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
                    job = self._current = self._waiting.pop(0)
                    self._stage = "starting"
                    self._changed.notify_all()
                try:
                    (self._price_and_publish if job.kind == "price" else self._build_and_publish)(job)
                except Exception as error:  # noqa: BLE001 - one template failing must not stop the others
                    with self._lock:
                        self._failed[job.template.id] = one_line(error)
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

    def _staging(self, template_id: str, suffix: str = "") -> Path:
        """A fresh folder: inside a folder store (same file system: publishing is a rename), else temporary."""
        if isinstance(self.store, FolderStore):
            staging = self.store.root / STAGING_DIR_NAME / f"{template_id}{suffix}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            return staging
        return Path(tempfile.mkdtemp(prefix=f"sakura-build-{template_id}{suffix}-"))

    def _build_and_publish(self, job: Job) -> None:
        """Published unpriced (room in its header), its files kept (hard links) and a pricing job queued behind
        every build, when ``measure`` is set; else built and published in one go."""
        template = job.template
        split = self.measure is not None
        settings = self.unpriced if split else self.settings
        staging = self._staging(template.id)
        kept = None
        try:
            later = {"price_later": True} if split else {}
            self.build(template, staging, progress=self._report_stage, **settings.builder_kw(), **later)
            if split:  # publishing a folder store moves the staged files: keep the same bytes for the measurement
                kept = self._staging(template.id, PRICED_SUFFIX)
                for path in staging.iterdir():
                    if path.is_file():
                        os.link(path, kept / path.name)
            self._report_stage("publishing")
            self.store.publish(template.id, staging, settings.key(template))
            if kept is not None:
                with self._changed:
                    self._waiting.append(Job(template, "price", kept))  # behind every build: usable first
                kept = None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if kept is not None:
                shutil.rmtree(kept, ignore_errors=True)

    def _published_files(self, template) -> Path:
        """A folder with the template's published packs (hard links in a folder store, else read from it)."""
        kept = self._staging(template.id, PRICED_SUFFIX)
        for name in FORMATS:
            fid = file_id(template.id, name)
            if isinstance(self.store, FolderStore):
                os.link(self.store.root / f"{fid}.pack", kept / f"{fid}.pack")
            else:
                (kept / f"{fid}.pack").write_bytes(self.store.read(fid, 0, self.store.size(fid)))
        return kept

    def _price_and_publish(self, job: Job) -> None:
        """Measure the kept build's output prices into its SAKURA pack's header (a new file, every chunk where it
        was: the published one is untouched until it is replaced) and publish it again, under the priced key."""
        staged = job.staged or self._published_files(job.template)
        try:
            self.measure(job.template, staged, self.settings.model_path, self._report_stage)
            self._report_stage("publishing")
            self.store.publish(job.template.id, staged, self.settings.key(job.template))
        finally:
            shutil.rmtree(staged, ignore_errors=True)
