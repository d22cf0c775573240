"""The device agent: owns request-specific inference on the device.

One edit = validate the job → decode the user's photo in memory → stream the template's cache
from the template server with the chosen system over a shaped link → masked edit → (after the
timed edit) the FP16-reference output for comparison → result. Events describe every step; see
``docs/device-protocol.md`` for the wire format (the agent's events *are* the protocol's events).

Privacy: the photo and the prompt are used only in this process. The only things sent to the
template server are file ids and byte ranges (every request is recorded and returned to the
client as ``sent_to_server``). Each edit gets its own temporary folder, removed when the edit
ends; the photo is never written anywhere (not even there).
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from device_bridge.links import AuditedLink, DeviceShapedLink, EditCancelled
from device_bridge.media import PhotoError, b64decode_field, decode_photo, mask_overlay, png_b64

log = logging.getLogger("device_bridge")

PROTOCOL_VERSION = 1
DEFAULT_TIMEOUT_S = 60.0  # a shard that has not arrived by then fails the edit (bandwidth collapse)
DEFAULT_BUSY_WAIT_S = 600.0  # a second client waits this long for the agent, then gets "busy"
TRACE_WINDOW_S = 30.0
MAX_PROMPT_CHARS = 2000
MAX_TRACE_CSV_BYTES = 4 * 1024 * 1024
PHOTO_DECODE_SIZE = 256  # decoded square; resized again to the model's reference size
SYSTEMS = ("sakura", "fp16", "intq", "cachegen", "local", "oracle")
REGIMES = ("paper", "none")
JOB_KEYS = {"template_id", "system", "prompt", "reference_png_b64", "network", "reference_output"}
NETWORK_KEYS = {"trace", "start", "scale", "regime", "trace_csv"}

EventCallback = Callable[[dict], None]


class EditRejected(ValueError):
    """The job cannot run as given (bad photo, empty prompt, unknown template/system, bad trace…).
    ``str(e)`` is one friendly line."""

    code = "rejected"


class EditFailed(RuntimeError):
    """The job was valid but the edit failed (template server unreachable, packs missing, cache
    stream timed out, client cancelled…). ``str(e)`` is one line; ``code`` says which kind."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


def one_line(text: object, limit: int = 400) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


def jsonable(obj: Any) -> Any:
    """Plain JSON types only: numpy → Python, tuples → lists, non-finite floats → None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


# --------------------------------------------------------------------------------------- the job
@dataclass
class NetworkSpec:
    trace: str = "5g"
    start: float | None = None
    scale: float | None = None
    regime: str = "paper"
    trace_csv: str | None = None


@dataclass
class JobSpec:
    template: Any  # sakura.catalog.Template
    system: str
    prompt: str
    photo: np.ndarray | None  # decoded square float image, or None
    network: NetworkSpec
    reference_output: bool = True


def _number(value: Any, what: str, *, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EditRejected(f"network.{what} must be a number or null")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise EditRejected(f"network.{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return v


def parse_job(job: Any, catalog) -> JobSpec:
    """Validate a job dict (protocol v1) → :class:`JobSpec`; :class:`EditRejected` otherwise."""
    from sakura.catalog import UnknownTemplateError

    if not isinstance(job, dict):
        raise EditRejected("the job must be a JSON object")
    tid = job.get("template_id")
    if not isinstance(tid, str) or not tid.strip():
        raise EditRejected("template_id is missing")
    try:
        tpl = catalog.get(tid.strip())
    except UnknownTemplateError as e:
        raise EditRejected(one_line(e)) from None
    system = job.get("system", "sakura")
    if not isinstance(system, str) or system not in SYSTEMS:
        raise EditRejected(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")
    prompt = job.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise EditRejected("prompt must be a string or null")
    prompt = (prompt or "").strip()
    if len(prompt) > MAX_PROMPT_CHARS:
        raise EditRejected(f"the instruction is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS})")
    photo = None
    if tpl.task == "mb":
        if not prompt:
            raise EditRejected(f"template {tpl.id} is a text edit: please type an instruction (the prompt is empty)")
    else:
        b64 = job.get("reference_png_b64")
        if b64 is None or (isinstance(b64, str) and not b64.strip()):
            what = "a face photo" if tpl.task == "fs" else "a garment photo"
            raise EditRejected(f"template {tpl.id} needs {what}: please upload an image")
        try:
            photo = decode_photo(b64decode_field(b64, "reference_png_b64"), PHOTO_DECODE_SIZE)
        except PhotoError as e:
            raise EditRejected(str(e)) from None
    net = job.get("network")
    if net is None:
        net = {}
    if not isinstance(net, dict):
        raise EditRejected('network must be an object like {"trace": "5g", "start": null, "scale": null, '
                           '"regime": "paper"}')
    trace = net.get("trace", "5g")
    if not isinstance(trace, str) or not trace.strip():
        raise EditRejected("network.trace must be a trace name (5g, 4g5g, wifi, fixed:<Mbps>) or a trace file")
    regime = net.get("regime", "paper")
    if regime is None:
        regime = "paper"
    if regime not in REGIMES:
        raise EditRejected(f"network.regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    csv = net.get("trace_csv")
    if csv is not None and (not isinstance(csv, str) or len(csv) > MAX_TRACE_CSV_BYTES):
        raise EditRejected(f"network.trace_csv must be the trace file's text (at most {MAX_TRACE_CSV_BYTES >> 20} MB)")
    ref_out = job.get("reference_output", True)
    if not isinstance(ref_out, bool):
        raise EditRejected("reference_output must be true or false")
    spec = NetworkSpec(trace.strip(), _number(net.get("start"), "start"),
                       _number(net.get("scale"), "scale", positive=True), regime, csv)
    return JobSpec(tpl, system, prompt, photo, spec, ref_out)


def load_network_trace(net: NetworkSpec, workdir: Path):
    """The unscaled trace and whether the template server can shape it by name."""
    from sakura.net.traces import SYNTHETIC_NAMES, TraceError, load_trace, read_trace_file

    try:
        if net.trace_csv is not None:
            name = Path(net.trace).name or "uploaded"
            p = workdir / ("".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60] or "trace")
            p.write_text(net.trace_csv, encoding="utf-8")
            tr = read_trace_file(p)
            return tr, False
        if net.trace in SYNTHETIC_NAMES or net.trace.startswith("fixed:"):
            return load_trace(net.trace), True
        return load_trace(net.trace), False  # a trace file on the device
    except TraceError as e:
        msg = str(e).replace(str(workdir) + "/", "")
        raise EditRejected(f"bad network trace: {one_line(msg)}") from None


def trace_window(trace, start: float, duration: float = TRACE_WINDOW_S) -> dict:
    """Step function for plotting: ``mbps[i]`` holds from ``t[i]`` to ``t[i+1]`` (len t = len mbps)."""
    w = trace.window(start, duration)
    t = [round(float(x), 4) for x in w.edges]
    mbps = [round(float(x), 3) for x in w.mbps]
    return {"t": t, "mbps": mbps + mbps[-1:]}


def transfer_split(tl) -> tuple[float, float, float]:
    """(transfer time, hidden, exposed): the union of request→arrival intervals, and how much of
    it overlapped a stall of execution (exposed) or not (hidden behind compute)."""

    def merge(iv):
        out: list[list[float]] = []
        for a, b in sorted((a, b) for a, b in iv if b > a):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out

    xfer = merge([(u.request_t, u.arrival_t) for u in tl.units])
    stalls = merge([(s.exec_start_t - s.stall_s, s.exec_start_t) for s in tl.shards if s.stall_s > 0])
    total = sum(b - a for a, b in xfer)
    exposed = 0.0
    for a, b in xfer:
        for c, d in stalls:
            exposed += max(0.0, min(b, d) - max(a, c))
    return total, max(0.0, total - exposed), exposed


# ------------------------------------------------------------------------------- per-template state
@dataclass
class _TemplateState:
    fp16_header: bytes
    fp16_info: Any
    compute: Any  # ComputeProfile
    headers: dict[str, bytes] = field(default_factory=dict)


class _Emitter:
    """Serialises events to the client callback; a failing callback means the client is gone."""

    def __init__(self, cb: EventCallback | None, cancel: threading.Event) -> None:
        self.cb, self.cancel = cb, cancel
        self._lock = threading.Lock()

    def __call__(self, event: dict) -> None:
        if self.cb is None:
            return
        ev = jsonable(event)
        with self._lock:
            try:
                self.cb(ev)
            except Exception:  # noqa: BLE001 - the client is gone: stop the edit
                log.info("event callback failed; cancelling the edit")
                self.cancel.set()


class DeviceAgent:
    """Runs edits for one device. Thread-safe; edits run one at a time (a second caller waits)."""

    def __init__(self, server_url: str | None = None, catalog=None, packs_dir: str | Path | None = None, *,
                 link: str = "ws", timeout_s: float = DEFAULT_TIMEOUT_S, workdir_root: str | Path | None = None,
                 busy_wait_s: float = DEFAULT_BUSY_WAIT_S, calibration_repeats: int = 1,
                 model_path: str | Path | None = None, reference_cache_templates: int = 2,
                 calibration_file: str | Path | None = None) -> None:
        from sakura.catalog import Catalog, load_catalog

        if link not in ("ws", "http"):
            raise ValueError(f"link must be 'ws' or 'http', got {link!r}")
        self.catalog = catalog if isinstance(catalog, Catalog) else load_catalog(catalog)
        self._server = None
        if server_url is None:
            if packs_dir is None:
                raise ValueError("give the template server's URL, or a packs folder to serve")
            if not Path(packs_dir).is_dir():
                raise ValueError(f"packs folder {packs_dir} does not exist: build packs with `sakura build`")
            from sakura.server.run import start_server

            self._server = start_server(packs_dir, process=True)
            server_url = self._server.url
        self.server_url = server_url.rstrip("/")
        self.link, self.timeout_s, self.busy_wait_s = link, float(timeout_s), float(busy_wait_s)
        self.workdir_root = Path(workdir_root) if workdir_root else None
        self.calibration_repeats, self.model_path = calibration_repeats, model_path
        self._lock = threading.Lock()
        self._waiting = 0
        self.stats = {"completed": 0, "rejected": 0, "failed": 0, "cancelled": 0}  # edits by outcome
        self._state: dict[str, _TemplateState] = {}
        self._ref_kv: OrderedDict[str, dict] = OrderedDict()
        self._ref_kv_max = max(1, reference_cache_templates)
        self._thumbs: dict[str, str] = {}
        # Measured device compute per (model, template): timings only, never request data. Kept in
        # memory; with ``calibration_file`` also loaded from / saved to that JSON file.
        self.calibration_file = Path(calibration_file) if calibration_file else None
        self._calibration: dict[str, dict] = {}
        if self.calibration_file is not None and self.calibration_file.is_file():
            import json

            try:
                self._calibration = dict(json.loads(self.calibration_file.read_text()))
            except (OSError, ValueError):
                log.warning("ignoring unreadable calibration file %s", self.calibration_file)

    # ---------------------------------------------------------------------------- small endpoints
    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def health(self) -> dict:
        ok = self._server_files() is not None
        return {"status": "ok", "protocol": PROTOCOL_VERSION, "busy": self.busy, "waiting": self._waiting,
                "server": self.server_url, "server_reachable": ok, "systems": list(SYSTEMS), "edits": dict(self.stats)}

    def _server_files(self) -> set[str] | None:
        import httpx

        try:
            r = httpx.get(self.server_url + "/templates", timeout=3.0)
            r.raise_for_status()
            return {d["id"] for d in r.json()}
        except Exception:  # noqa: BLE001 - unreachable server: "unknown"
            return None

    def templates(self) -> list[dict]:
        """The catalog for galleries: summary, input kind, a thumbnail with the mask tinted, and
        whether the template server holds the template's packs (``None`` = server unreachable)."""
        from sakura.catalog import TASK_NAMES
        from sakura.offline.builder import file_id

        files = self._server_files()
        out = []
        for t in self.catalog:
            d = t.summary()
            d["task_name"] = TASK_NAMES.get(t.task, t.task)
            d["input"] = "prompt" if t.task == "mb" else "photo"
            d["available"] = None if files is None else (t.id in files and file_id(t.id, "fp16") in files)
            d["thumbnail_png_b64"] = self._thumbnail(t)
            out.append(d)
        return out

    def _thumbnail(self, t, size: int = 128) -> str:
        if t.id not in self._thumbs:
            self._thumbs[t.id] = png_b64(mask_overlay(t.image(size), t.mask(size)))
        return self._thumbs[t.id]

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> "DeviceAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- warm-up
    def warmup(self, template_id: str) -> dict:
        """Load the template's model, read its headers and calibrate device compute (what the first
        edit of a template would otherwise do). Returns the measured compute profile."""
        from sakura.catalog import UnknownTemplateError
        from sakura.net.client import RangeClient

        try:
            tpl = self.catalog.get(template_id)
        except UnknownTemplateError as e:
            raise EditRejected(one_line(e)) from None
        with self._lock:
            model = self._model(tpl)
            probe = AuditedLink(RangeClient(self.server_url), [])
            try:
                st = self._template_state(tpl, model, probe, lambda ev: None)
            except (EditRejected, EditFailed):
                raise
            except Exception as e:  # noqa: BLE001
                raise EditFailed(self._describe(e)) from None
            finally:
                probe.close()
        return {"template_id": tpl.id, "compute": self._compute_summary(st.compute)}

    # ---------------------------------------------------------------------------------------- edit
    def edit(self, job: dict, on_event: EventCallback | None = None, *,
             cancel: threading.Event | None = None) -> dict:
        """Run one edit. Events (dicts, JSON-ready) go to ``on_event``, from several threads but
        never concurrently: return quickly. Returns the result event; raises :class:`EditRejected`
        or :class:`EditFailed` after emitting an ``error`` event."""
        cancel = cancel or threading.Event()
        emit = _Emitter(on_event, cancel)
        job_id = uuid.uuid4().hex[:12]
        t_start = time.perf_counter()
        workdir = Path(tempfile.mkdtemp(prefix="sakura-agent-", dir=self.workdir_root))

        def finish(event: dict) -> None:  # the private folder is gone before the client hears the end
            shutil.rmtree(workdir, ignore_errors=True)
            emit(event)

        try:
            spec = parse_job(job, self.catalog)
            trace, server_shapes = load_network_trace(spec.network, workdir)
            with self._slot(emit, cancel):
                emit({"type": "accepted", "job_id": job_id, "template_id": spec.template.id,
                      "system": spec.system, "workdir": str(workdir), "protocol": PROTOCOL_VERSION})
                result = jsonable(self._run(spec, trace, server_shapes, emit, cancel, t_start, job_id))
            result["timing"]["agent_s"] = time.perf_counter() - t_start  # bridge overhead = wall − this
            self._count("completed")
            finish(result)
            return result
        except (EditRejected, EditFailed) as e:
            self._count(e.code)
            finish({"type": "error", "code": e.code, "message": one_line(e)})
            raise
        except Exception as e:  # noqa: BLE001 - never a traceback to the client
            msg, code = self._classify(e, cancel)
            err = EditRejected(msg) if code == "rejected" else EditFailed(msg, code)
            if code == "internal":
                log.exception("internal error in edit %s", job_id)
            self._count(code)
            finish({"type": "error", "code": err.code, "message": one_line(err)})
            raise err from None
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _count(self, code: str) -> None:
        key = code if code in ("completed", "rejected", "cancelled") else "failed"
        self.stats[key] += 1

    def _classify(self, e: BaseException, cancel: threading.Event) -> tuple[str, str]:
        from sakura.catalog import CatalogError
        from sakura.model import ModelInputError, ModelLoadError

        if cancel.is_set() or isinstance(e, EditCancelled):
            return "edit cancelled: the client disconnected", "cancelled"
        if isinstance(e, (ModelInputError, CatalogError)):
            return one_line(e), "rejected"
        if isinstance(e, ModelLoadError):
            return f"the device model cannot be loaded: {one_line(e)}", "failed"
        msg = self._describe(e)
        return msg, ("internal" if msg.startswith("internal error") else "failed")

    def _describe(self, e: BaseException) -> str:
        import httpx

        from sakura.net.client import FetchError
        from sakura.offline.container import PackFormatError
        from sakura.runtime.stream import StreamError

        if isinstance(e, StreamError):
            return f"the cache stream failed: {one_line(e)}"
        if isinstance(e, FetchError):
            return f"the template server refused a request: {one_line(e)}"
        if isinstance(e, (httpx.HTTPError, ConnectionError, OSError)) or type(e).__module__.startswith("websockets"):
            return f"cannot reach the template server at {self.server_url}: {type(e).__name__}: {one_line(e, 200)}"
        if isinstance(e, PackFormatError):
            return f"the template's pack is malformed: {one_line(e)}"
        return f"internal error ({type(e).__name__}): {one_line(e, 200)}"

    class _Slot:
        def __init__(self, agent: "DeviceAgent", emit, cancel) -> None:
            self.agent, self.emit, self.cancel = agent, emit, cancel

        def __enter__(self):
            a = self.agent
            if a._lock.acquire(blocking=False):
                return self
            a._waiting += 1
            try:
                self.emit({"type": "queued", "message": "another edit is running on this device; waiting",
                           "waiting": a._waiting})
                deadline = time.monotonic() + a.busy_wait_s
                while not a._lock.acquire(timeout=0.25):
                    if self.cancel.is_set():
                        raise EditCancelled("edit cancelled while waiting")
                    if time.monotonic() > deadline:
                        raise EditFailed(f"the device is busy with another edit (waited {a.busy_wait_s:.0f} s)",
                                         "busy")
            finally:
                a._waiting -= 1
            return self

        def __exit__(self, *exc) -> None:
            self.agent._lock.release()

    def _slot(self, emit, cancel) -> "_Slot":
        return DeviceAgent._Slot(self, emit, cancel)

    # ------------------------------------------------------------------------------------ internals
    def _model(self, tpl):
        from sakura.editing import model_for

        return model_for(tpl, self.model_path)

    def _template_state(self, tpl, model, probe, emit) -> _TemplateState:
        from sakura.editing import edit_request
        from sakura.net.client import FetchError
        from sakura.offline.builder import file_id
        from sakura.offline.fp16 import Fp16Info
        from sakura.runtime.compute import measure_compute, zero_cache
        from sakura.runtime.stream import read_header

        st = self._state.get(tpl.id)
        if st is not None:
            return st
        fid = file_id(tpl.id, "fp16")
        try:
            header = read_header(probe, fid)
        except FetchError as e:
            if e.status == 404:
                raise EditFailed(f"the template server at {self.server_url} has no packs for {tpl.id}: build them "
                                 f"with `sakura build --templates {tpl.id}`", "unavailable") from None
            raise
        info = Fp16Info.from_bytes(header)
        first = tpl.profile_requests[0] if tpl.profile_requests else None
        creq = edit_request(tpl, first, prompt="a photo", resolution=model.codec.resolution,
                            ref_size=model.codec.ref_size)
        if creq.task in ("fs", "vton") and creq.reference is None:
            creq.reference = np.full((model.codec.ref_size, model.codec.ref_size, 3), 0.5, np.float32)
        shard_size = info.shards[0][2] - info.shards[0][1]
        compute = self._load_calibration(model, tpl, info.shards)
        if compute is None:
            emit({"type": "status", "stage": "calibrating",
                  "message": f"measuring device compute for {tpl.id} (first edit of this template only)"})
            compute = measure_compute(model, creq, zero_cache(model, creq), shard_size,
                                      repeats=self.calibration_repeats)
            if [tuple(s) for s in compute.shards] != [tuple(s) for s in info.shards]:
                raise EditFailed(f"{tpl.id}: the packs' shard plan does not match this model", "failed")
            self._save_calibration(model, tpl, compute)
        st = _TemplateState(header, info, compute, {fid: header})
        self._state[tpl.id] = st
        return st

    @staticmethod
    def _calibration_key(model, tpl) -> str:
        return f"{model.model_id}/{tpl.id}"

    def _load_calibration(self, model, tpl, shards):
        from sakura.runtime.compute import ComputeProfile

        d = self._calibration.get(self._calibration_key(model, tpl))
        if not d:
            return None
        try:
            prof = ComputeProfile([tuple(s) for s in d["shards"]], [float(x) for x in d["shard_s"]],
                                  float(d["prelude_s"]), float(d["local_full_s"]))
        except (KeyError, TypeError, ValueError):
            return None
        return prof if prof.shards == [tuple(s) for s in shards] else None

    def _save_calibration(self, model, tpl, compute) -> None:
        import json

        self._calibration[self._calibration_key(model, tpl)] = jsonable(compute.to_dict())
        if self.calibration_file is not None:
            try:
                tmp = self.calibration_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(self._calibration, indent=1))
                tmp.replace(self.calibration_file)
            except OSError as e:
                log.warning("cannot save calibration to %s: %s", self.calibration_file, e)

    def _header(self, st: _TemplateState, probe, fid: str, template_id: str) -> bytes:
        from sakura.net.client import FetchError
        from sakura.runtime.stream import read_header

        if fid not in st.headers:
            try:
                st.headers[fid] = read_header(probe, fid)
            except FetchError as e:
                if e.status == 404:
                    raise EditFailed(f"the template server at {self.server_url} has no {fid}.pack: build it with "
                                     f"`sakura build --templates {template_id}`", "unavailable") from None
                raise
        return st.headers[fid]

    def _reference_kv(self, tpl, st: _TemplateState, probe, emit) -> dict:
        """The template's exact FP16 cache (template data, fetched unshaped, cached in memory)."""
        from sakura.offline.builder import file_id
        from sakura.online.encodings import encoding_from_header

        if tpl.id in self._ref_kv:
            self._ref_kv.move_to_end(tpl.id)
            return self._ref_kv[tpl.id]
        emit({"type": "status", "stage": "reference_cache", "message": "fetching the FP16 reference cache"})
        fid = file_id(tpl.id, "fp16")
        enc = encoding_from_header("fp16", st.fp16_header)
        kv: dict = {}
        for u in enc.units:
            lv = u.levels[0]
            kv.update(enc.decode(u, lv, probe.fetch(fid, enc.ranges(u, lv))))
        self._ref_kv[tpl.id] = kv
        while len(self._ref_kv) > self._ref_kv_max:
            self._ref_kv.popitem(last=False)
        return kv

    @staticmethod
    def _compute_summary(c) -> dict:
        return {"masked_s": c.masked_s, "local_full_s": c.local_full_s, "prelude_s": c.prelude_s,
                "shard_s": list(c.shard_s)}

    def _make_link(self, trace_name: str, trace, server_shapes: bool, start: float, scale: float):
        from sakura.net.client import RangeClient, WsRangeClient
        from sakura.net.shaping import RateSpec

        if server_shapes:
            rate = RateSpec(trace_name, start, scale)
            inner = WsRangeClient(self.server_url, rate=rate) if self.link == "ws" else RangeClient(self.server_url,
                                                                                                      rate=rate)
            return inner, {"trace": trace_name, "start": start, "scale": scale, "shaped_by": "template server"}
        inner = WsRangeClient(self.server_url) if self.link == "ws" else RangeClient(self.server_url)
        return DeviceShapedLink(inner, trace.scaled(scale), start), {
            "trace": trace_name, "start": start, "scale": scale, "shaped_by": "device"}

    def _run(self, spec: JobSpec, trace, server_shapes: bool, emit, cancel, t_start: float, job_id: str) -> dict:
        from sakura.catalog.images import resize_square
        from sakura.editing import edit_request
        from sakura.eval.metrics import quality
        from sakura.net.client import RangeClient
        from sakura.net.traces import paper_regime_scale
        from sakura.offline.builder import file_id
        from sakura.online.encodings import encoding_from_header
        from sakura.online.policies import get_policy
        from sakura.runtime.stream import StreamedEdit
        from sakura.runtime.timeline import Timeline

        tpl, timing = spec.template, {}
        pol = get_policy(spec.system)
        if tpl.id not in self._state:
            emit({"type": "status", "stage": "loading_model", "message": f"loading the model for {tpl.id}"})
        model = self._model(tpl)
        ref_img = resize_square(spec.photo, model.codec.ref_size) if spec.photo is not None else None
        req = edit_request(tpl, prompt=spec.prompt if tpl.task == "mb" else "", reference=ref_img, resolution=model.codec.resolution,
                           ref_size=model.codec.ref_size)
        model.validate(req)

        sent: list[dict] = []
        probe = AuditedLink(RangeClient(self.server_url), sent, cancel)
        stream_link = None
        try:
            t0 = time.perf_counter()
            calibrated = tpl.id not in self._state
            st = self._template_state(tpl, model, probe, emit)
            timing["setup_s"] = time.perf_counter() - t0
            if calibrated:
                timing["calibration_s"] = timing["setup_s"]
            compute = st.compute
            fp16_bytes = st.fp16_info.storage_bytes
            if spec.network.scale is not None:
                scale = spec.network.scale
            elif spec.network.regime == "paper":
                scale = paper_regime_scale(trace, fp16_bytes, compute.local_full_s)
            else:
                scale = 1.0
            start = spec.network.start if spec.network.start is not None else random.uniform(0.0, trace.duration)
            scaled = trace.scaled(scale)
            initial_bps = float(scaled.rate_at(start)) * 1e6

            enc, fid = None, None
            if pol.streams:
                fid = file_id(tpl.id, pol.encoding)
                enc = encoding_from_header(pol.encoding, self._header(st, probe, fid, tpl.id))
                if [tuple(s) for s in enc.shards] != [tuple(s) for s in compute.shards]:
                    raise EditFailed(f"{fid}: its shard plan does not match the FP16 file's", "failed")
            emit({"type": "plan", "job_id": job_id, "template_id": tpl.id, "system": spec.system,
                  "task": tpl.task, "shards": [list(s) for s in compute.shards],
                  "units": [{"unit": u.index, "shard": u.needed_by, "label": u.label} for u in enc.units] if enc else [],
                  "trace": trace_window(scaled, start), "trace_name": spec.network.trace, "trace_start": start,
                  "trace_scale": scale, "initial_mbps": initial_bps / 1e6,
                  "compute": self._compute_summary(compute), "fp16_bytes": fp16_bytes,
                  "stored_bytes": enc.storage_bytes if enc else 0, "timeout_s": self.timeout_s})
            if cancel.is_set():
                raise EditCancelled("cancelled")

            link_info = None
            t0 = time.perf_counter()
            if pol.streams:
                inner, link_info = self._make_link(spec.network.trace, trace, server_shapes, start, scale)
                stream_link = AuditedLink(inner, sent, cancel)
                stream_link.reset_link()
                runner = StreamedEdit(model, enc, pol, stream_link, fid, compute, initial_bps,
                                      timeout_s=self.timeout_s,
                                      on_event=lambda kind, data: emit({"type": kind, **data}))
                res, tl = runner.run(req)
            elif spec.system == "local":
                res = model.full_edit(req)
                tl = Timeline(pol.name, "real")
                tl.latency_s = res.seconds
            else:  # oracle: the FP16 cache is already on the device (fetched before, untimed)
                kv = self._reference_kv(tpl, st, probe, emit)
                res, tl = _timed_masked(model, req, kv, compute.shards, pol.name, emit)
            timing["edit_s"] = time.perf_counter() - t0
            tl.trace_start_s = start
            if cancel.is_set():
                raise EditCancelled("cancelled")

            reference, metrics = None, None
            if spec.reference_output:
                t0 = time.perf_counter()
                if spec.system == "oracle":
                    reference = res.image
                else:
                    kv = self._reference_kv(tpl, st, probe, emit)
                    emit({"type": "status", "stage": "reference",
                          "message": "computing the FP16-reference output for comparison"})
                    reference = model.masked_edit(req, lambda s, layer: kv[(s, layer)]).image
                metrics = quality(res.image, reference, req.mask)
                timing["reference_s"] = time.perf_counter() - t0
        finally:
            probe.close()
            if stream_link is not None:
                stream_link.close()

        xfer, hidden, exposed = transfer_split(tl)
        summary = {**tl.summary(), "latency_s": tl.latency_s, "stall_s": tl.stall_s, "bytes": tl.bytes_total,
                   "fp16_bytes": fp16_bytes, "transfer_s": xfer, "transfer_hidden_s": hidden,
                   "transfer_exposed_s": exposed, "compute_s": compute.masked_s if spec.system != "local"
                   else compute.local_full_s, "trace_scale": scale, "trace_start": start}
        return {"type": "result", "job_id": job_id, "template_id": tpl.id, "system": spec.system,
                "image_png_b64": png_b64(res.image),
                "reference_png_b64": png_b64(reference) if reference is not None else None,
                "mask_png_b64": png_b64(req.mask), "metrics": metrics, "summary": summary,
                "timeline": tl.to_dict(), "sent_to_server": sent, "link_emulation": link_info, "timing": timing}


def _timed_masked(model, req, kv: dict, shards, name: str, emit):
    """A masked run on a cache already in memory, with shard start/end times like the streamed
    runtime's (no stalls)."""
    from sakura.runtime.timeline import ShardRecord, Timeline

    tl = Timeline(name, "real")
    tl.shards = [ShardRecord(j, s, (a, b)) for j, (s, a, b) in enumerate(shards)]
    shard_of = {(s, layer): j for j, (s, a, b) in enumerate(shards) for layer in range(a, b)}
    started: set[int] = set()
    t0 = time.perf_counter()

    def provider(step: int, layer: int):
        j = shard_of[(step, layer)]
        if j not in started:
            now = time.perf_counter() - t0
            if j > 0:
                tl.shards[j - 1].exec_end_t = now
                emit({"type": "shard_end", "shard": j - 1, "t": now})
            started.add(j)
            tl.shards[j].exec_start_t = now
            emit({"type": "shard_start", "shard": j, "t": now, "stall_s": 0.0})
        return kv[(step, layer)]

    res = model.masked_edit(req, provider)
    end = time.perf_counter() - t0
    if tl.shards:
        tl.shards[-1].exec_end_t = end
        emit({"type": "shard_end", "shard": len(tl.shards) - 1, "t": end})
    tl.latency_s = end
    return res, tl
