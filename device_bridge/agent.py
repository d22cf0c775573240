"""The device agent: owns request-specific inference on the device.

One edit = validate the job (:func:`~device_bridge.protocol.parse_job`) → an
:class:`~sakura.runtime.session.EditSession` over an audited link to the template server → the
session's timed run → (after it) the FP16-reference output for comparison → the result. The events
are the runtime timeline's own plus the agent's (``docs/device-protocol.md``).

Privacy: the photo and the prompt are used only in this process, never written anywhere. The only
things sent to the template server are file ids and byte ranges (every request is recorded and
returned as ``sent_to_server``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import httpx

from device_bridge.links import AuditedLink, EditCancelled
from device_bridge.media import mask_overlay, png_b64
from device_bridge.prefetcher import DEFAULT_THINK_S, Prefetcher
from device_bridge.protocol import (
    DEFAULT_TIMEOUT_S,
    PROTOCOL_VERSION,
    EditFailed,
    EditRejected,
    Job,
    event,
    jsonable,
    one_line,
    parse_job,
    parse_network,
)
from device_bridge.slot import EditSlot
from sakura.catalog import TASK_NAMES, Catalog, CatalogError, load_catalog
from sakura.editing import model_for
from sakura.formats import PackFormatError, file_id
from sakura.model import ModelInputError, ModelLoadError
from sakura.net.client import FetchError, RangeClient, WsRangeClient
from sakura.net.failover import FailoverSource
from sakura.net.kernel import KernelLink
from sakura.net.paced import LinkClosed
from sakura.net.store_reader import ServerStoreClient, pack_bytes_from
from sakura.net.traces import TraceError
from sakura.runtime.backends import EXECUTOR_TITLES, WHERE, BackendChoice, Backends, programs_beside
from sakura.runtime.calibration import CalibrationStore
from sakura.runtime.errors import StreamError, TemplateUnavailable
from sakura.runtime.executors.errors import BackendUnavailable
from sakura.runtime.session import DeviceRuntime, EditInput
from sakura.server.run import start_server
from sakura.systems import OURS, SYSTEMS

log = logging.getLogger("device_bridge")

DEFAULT_BUSY_WAIT_S = 600.0  # a second client waits this long for the agent, then gets "busy"
EventCallback = Callable[[dict], None]


class _Emitter:
    """Serialises events to the client callback; a failing callback means the client is gone."""

    def __init__(self, callback: EventCallback | None, cancel: threading.Event) -> None:
        self.callback, self.cancel = callback, cancel
        self._lock = threading.Lock()

    def __call__(self, ev: dict) -> None:
        if self.callback is None:
            return
        with self._lock:
            try:
                self.callback(jsonable(ev))
            except Exception:  # noqa: BLE001 - the client is gone: stop the edit
                log.info("event callback failed; cancelling the edit")
                self.cancel.set()


class DeviceAgent:
    """Runs edits for one device. Thread-safe; edits run one at a time (a second caller waits)."""

    def __init__(self, server_url: str | None = None, catalog=None, packs_dir: str | Path | None = None, *,
                 link: str = "ws", timeout_s: float = DEFAULT_TIMEOUT_S, busy_wait_s: float = DEFAULT_BUSY_WAIT_S,
                 calibration_repeats: int = 1, model_path: str | Path | None = None,
                 reference_cache_templates: int = 2, calibration_file: str | Path | None = None,
                 backends: BackendChoice | None = None, kernel: KernelLink | None = None) -> None:
        """``kernel``: this agent runs inside a kernel-shaped link's namespace; its edits' links are shaped there
        by tc along their traces, not paced here (and nothing is prefetched: the link is shaped only during an
        edit). ``backends``: the executor and reconstructor every edit runs on (default eager + torch; ``auto``:
        the phone-style stack where it works here). A backend that cannot run raises BackendUnavailable at
        once, its one line naming the fallback."""
        if link not in ("ws", "http"):
            raise ValueError(f"link must be 'ws' or 'http', got {link!r}")
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        choice = backends or BackendChoice()
        if choice.programs_dir is None and packs_dir is not None:  # programs beside the packs it serves
            choice = BackendChoice(choice.executor, choice.reconstructor, programs_beside(packs_dir), choice.offload)
        device_backends = Backends(choice)
        self.backends = device_backends.check()  # a backend that cannot run fails here, before anything starts
        self._server = None
        if server_url is None:
            if packs_dir is None:
                raise ValueError("give the template server's URL, or a packs folder to serve")
            if not Path(packs_dir).is_dir():
                raise ValueError(f"packs folder {packs_dir} does not exist: build packs with `sakura build`")
            self._server = start_server(packs_dir, process=True)
            server_url = self._server.url
        # one URL, or several (URL,URL): replicas of the same packs, tried in order when one dies
        self.server_urls = [u.strip().rstrip("/") for u in server_url.split(",") if u.strip()]
        self.server_url = self.server_urls[0]
        self.transport, self.timeout_s = link, float(timeout_s)
        self.kernel = kernel
        self.slot = EditSlot(busy_wait_s)
        self.stats = {"completed": 0, "rejected": 0, "failed": 0, "cancelled": 0}  # edits by outcome
        self.runtime = DeviceRuntime(self._replicas(RangeClient), model_path=model_path,
                                     calibration=CalibrationStore(calibration_file, calibration_repeats),
                                     reference_caches=reference_cache_templates, backends=device_backends)
        self._thumbs: dict[str, str] = {}
        self._bytes_from: str | None = None  # "store" | "server", once the server has said
        self.prefetcher = Prefetcher(self.runtime, self._client)

    def _client(self):
        """The link for one edit. A server whose packs are in an object store sends the device to the store for
        the bytes (presigned URLs, one Range per request) whatever ``link`` says: it has no websocket stream."""
        if self._bytes_from is None:
            self._bytes_from = pack_bytes_from(self.server_url)
        if self._bytes_from == "store":
            return self._replicas(ServerStoreClient)
        # (a kernel link may leave a request stuck in a trough and go on beside it: HTTP, whose client pools
        # connections, not the websocket stream, whose one connection answers in order)
        return self._replicas(WsRangeClient if self.transport == "ws" and self.kernel is None else RangeClient)

    def _replicas(self, client):
        """``client`` for the server, or a failover over one per replica (in the operator's order)."""
        if len(self.server_urls) == 1:
            return client(self.server_url)
        return FailoverSource([client(u) for u in self.server_urls], names=self.server_urls)

    # ---------------------------------------------------------------------------- small endpoints
    @property
    def busy(self) -> bool:
        return self.slot.busy

    def health(self) -> dict:
        return {"status": "ok", "protocol": PROTOCOL_VERSION, "busy": self.busy, "waiting": self.slot.waiting,
                "server": self.server_url, "server_reachable": self._server_files() is not None,
                "systems": list(SYSTEMS), "edits": dict(self.stats), "backends": self.backends_summary()}

    def backends_summary(self) -> dict:
        """What this device's edits run on (before any template: Flux2 templates; an SD3 one runs eager)."""
        b = self.runtime.backends
        return {**self.backends, "asked": b.choice.label, "executor_title": EXECUTOR_TITLES[self.backends["executor"]],
                "reconstructor_title": b.reconstructor_title(), "where": WHERE,
                "note": b.note}

    def _server_files(self) -> set[str] | None:
        try:
            return {d["id"] for d in self.runtime.source.templates()}
        except Exception:  # noqa: BLE001 - unreachable server: "unknown"
            return None

    def templates(self) -> list[dict]:
        """The catalog for galleries: summary, input kind, a thumbnail with the mask tinted, and
        whether the template server holds the template's files (``None`` = server unreachable)."""
        files = self._server_files()
        out = []
        for t in self.catalog:
            d = t.summary()
            d["task_name"] = TASK_NAMES.get(t.task, t.task)
            d["input"] = "prompt" if t.task == "mb" else "photo"
            d["backends"] = self._planned_backends(t)
            d["available"] = None if files is None else (t.id in files and file_id(t.id, "fp16") in files)
            if t.id not in self._thumbs:
                self._thumbs[t.id] = png_b64(mask_overlay(t.image(128), t.mask(128)))
            d["thumbnail_png_b64"] = self._thumbs[t.id]
            out.append(d)
        return out

    def _planned_backends(self, template) -> dict | None:
        """What an edit of the template would run on (an SD3 template: eager, and why); None if unknown."""
        try:
            return self.runtime.backends.planned(model_for(template, self.runtime.model_path))
        except Exception:  # noqa: BLE001 - a model that cannot load says so when an edit asks for it
            return None

    def warmup(self, template_id: str) -> dict:
        """Load the template's model, read its headers, calibrate device compute and fetch the FP16
        reference cache (what its first edit would otherwise do). Returns the measured compute profile."""
        try:
            template = self.catalog.get(template_id)
        except CatalogError as e:
            raise EditRejected(one_line(str(e).strip("'\""))) from None
        with self.slot.hold():
            try:
                state = self.runtime.template_state(template)
                executor, _, ran = self.runtime.backends_for(state)  # exports the shard programs now, if any
                self.runtime.compute_for(state, executor)  # and times them
                self.runtime.reference_kv(state)  # the FP16 cache a first edit's comparison would fetch
                for system in SYSTEMS.values():  # and every streamed file's header there is
                    if system.streams:
                        with contextlib.suppress(TemplateUnavailable):
                            self.runtime.encoding(state, system.format)
            except Exception as e:  # noqa: BLE001
                raise EditFailed(*self._describe(e)) from None
        return {"template_id": template.id, "compute": state.compute.to_dict(), "backends": ran.to_dict()}

    def prefetch(self, template_id: str, network=None, think_s: float = DEFAULT_THINK_S) -> dict:
        """The person picked a template: start fetching its pack (template data only) over ``network``
        (a job's network object) while they choose a photo or type a prompt. Returns at once."""
        try:
            template = self.catalog.get(template_id)
        except CatalogError as e:
            raise EditRejected(one_line(str(e).strip("'\""))) from None
        net = parse_network(network)
        if self.kernel is not None:
            return {"template_id": template.id, "held": None, "off": "no prefetch on a kernel-shaped link"}
        try:
            return self.prefetcher.start(template, net.network(),
                                         think_s)
        except Exception as e:  # noqa: BLE001
            raise EditFailed(*self._describe(e)) from None

    def close(self) -> None:
        self.prefetcher.stop()
        self.runtime.source.close()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "DeviceAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- edit
    def edit(self, job: Job | dict, on_event: EventCallback | None = None, *,
             cancel: threading.Event | None = None) -> dict:
        """Run one edit. Events go to ``on_event``, from several threads but never concurrently:
        return quickly. Returns the result event; raises :class:`EditRejected` or
        :class:`EditFailed` after emitting an ``error`` event."""
        cancel = cancel or threading.Event()
        emit = _Emitter(on_event, cancel)
        job_id, t_start = uuid.uuid4().hex[:12], time.perf_counter()
        try:
            spec, template = parse_job(job, self.catalog)
            with self.slot.take(emit, cancel):
                emit(event("accepted", job_id=job_id, template_id=template.id, system=spec.system,
                           protocol=PROTOCOL_VERSION))
                result = self._run(spec, template, emit, cancel, job_id)
            result["timing"]["agent_s"] = time.perf_counter() - t_start  # bridge overhead = wall − this
            self.stats["completed"] += 1
            emit(result)
            return result
        except (EditRejected, EditFailed) as e:
            self._fail(emit, e)
            raise
        except Exception as e:  # noqa: BLE001 - never a traceback to the client
            message, code = (("edit cancelled: the client disconnected", "cancelled")
                             if cancel.is_set() or isinstance(e, (EditCancelled, LinkClosed)) else self._describe(e))
            err = EditRejected(message) if code == "rejected" else EditFailed(message, code)
            if code == "internal":
                log.exception("internal error in edit %s", job_id)
            self._fail(emit, err)
            raise err from None

    def _fail(self, emit, e: EditRejected | EditFailed) -> None:
        self.stats[e.code if e.code in ("rejected", "cancelled") else "failed"] += 1
        emit(event("error", code=e.code, message=one_line(e)))

    def _run(self, spec: Job, template, emit, cancel: threading.Event, job_id: str) -> dict:
        sent: list[dict] = []
        source = AuditedLink(self._client(), sent, cancel)
        timing: dict[str, float] = {}
        net = spec.network
        held, goes_on_at = self.prefetcher.take(template.id)  # the edit continues the prefetch's link
        held = held if spec.system == OURS and spec.prefetch else None  # (prefetch fetches SAKURA's pack)
        start = net.start if net.start is not None or held is None else goes_on_at
        def on_event(e: dict) -> None:  # the plan event carries the job's id (device protocol)
            emit(event("plan", job_id=job_id, **{k: v for k, v in e.items() if k != "type"})
                 if e.get("type") == "plan" else e)

        try:
            t0 = time.perf_counter()
            calibrating = not self.runtime.knows(template)
            session = self.runtime.session(
                template, spec.system, dataclasses.replace(net.network(start), kernel=self.kernel), source=source,
                on_event=on_event, on_status=lambda stage, msg: emit(event("status", stage=stage, message=msg)),
                timeout_s=self.timeout_s, prefetched=held)
            timing["setup_s"] = time.perf_counter() - t0
            if calibrating:
                timing["calibration_s"] = timing["setup_s"]
            catalog_request = None if spec.catalog_request is None else template.eval_requests[spec.catalog_request]
            def on_output(report) -> None:  # the edit is done: show it before the comparison's reference
                emit(event("output", job_id=job_id, image_png_b64=png_b64(report.image),
                           mask_png_b64=png_b64(report.request.mask), summary=report.summary,
                           reference_follows=spec.reference_output))

            report = session.edit(EditInput(spec.prompt, spec.photo.image() if spec.photo else None, catalog_request),
                                  clock=spec.clock, with_reference=spec.reference_output, cancel=cancel,
                                  on_output=on_output)
            timing.update(report.timing)
        finally:
            source.close()
        return event(
            "result",
            job_id=job_id,
            template_id=template.id,
            system=spec.system,
            image_png_b64=png_b64(report.image),
            reference_png_b64=png_b64(report.reference) if report.reference is not None else None,
            mask_png_b64=png_b64(report.request.mask),
            metrics=report.quality,
            summary=report.summary,
            sent_to_server=sent,
            # a simulated edit emitted no timeline events: its timeline comes whole, for the viewer to draw
            **({"timeline": report.timeline.to_dict()} if spec.clock == "sim" else {}),
            pack_bytes_from=self._bytes_from or "server",
            backends=session.backends.to_dict(),
            link_emulation={"trace": net.trace, "start": session.start, "scale": session.scale,
                            "shaped_by": "device" if spec.clock == "real" else "simulated clock"}
            if session.system.streams
            else None,
            timing=timing,
        )

    def _describe(self, e: BaseException) -> tuple[str, str]:
        """(one-line message, error code) for an exception of an edit."""
        if isinstance(e, (ModelInputError, CatalogError)):
            return one_line(e), "rejected"
        if isinstance(e, TraceError):  # the job's network trace cannot drive this edit
            return f"bad network trace: {one_line(e)}", "rejected"
        if isinstance(e, ModelLoadError):
            return f"the device model cannot be loaded: {one_line(e)}", "failed"
        if isinstance(e, TemplateUnavailable):
            return f"the template server at {self.server_url} has {one_line(e)}", "unavailable"
        if isinstance(e, StreamError):
            return f"the cache stream failed: {one_line(e)}", "failed"
        if isinstance(e, FetchError):
            return f"the template server refused a request: {one_line(e)}", "failed"
        if isinstance(e, (httpx.HTTPError, ConnectionError, OSError)) or type(e).__module__.startswith("websockets"):
            return (f"cannot reach the template server at {self.server_url}: {type(e).__name__}: "
                    f"{one_line(e, 200)}", "failed")
        if isinstance(e, BackendUnavailable):
            return f"a device backend cannot run: {one_line(e)}", "failed"
        if isinstance(e, PackFormatError):
            return f"the template's pack is malformed: {one_line(e)}", "failed"
        return f"internal error ({type(e).__name__}): {one_line(e, 200)}", "internal"
