"""The device protocol (v1), shared by the app and the agent: the job, its validator, the events.

The app checks the user's input once, on its side (:meth:`Photo.from_file`, :meth:`TraceUpload.from_file`),
and sends a :class:`Job` the agent need not re-parse: the photo as the decoded, centre-cropped pixels
(raw bytes on the wire, no image codec) and an uploaded trace as its samples. Over the in-process
bridge the :class:`Job` object itself travels. :func:`parse_job` is the one validator: it accepts a
:class:`Job` or its JSON form (and, for clients that did no checking, a photo as PNG/JPEG base64 or a
trace as CSV text). Events are JSON-ready dicts (``docs/device-protocol.md``); the timeline events come
from the runtime's :class:`~sakura.runtime.timeline.Timeline`, and :class:`EditProgress` folds every
event back into one (the app draws that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from device_bridge.errors import EditFailed, EditRejected, jsonable, one_line
from device_bridge.media import MAX_PHOTO_BYTES, Photo, TraceUpload, b64_field
from sakura.net.traces import SYNTHETIC_NAMES, Trace, TraceError, load_trace
from sakura.runtime.timeline import Timeline
from sakura.systems import COMPRESSED, FLOOR, OURS, SYSTEMS, get_system

__all__ = [
    "COMPRESSED",
    "FLOOR",
    "OURS",
    "EditFailed",
    "EditProgress",
    "EditRejected",
    "Job",
    "NetworkSpec",
    "Photo",
    "PROTOCOL_VERSION",
    "SYSTEMS",
    "TraceUpload",
    "event",
    "jsonable",
    "one_line",
    "parse_job",
]

PROTOCOL_VERSION = 1
REGIMES = ("paper", "none")
MAX_PROMPT_CHARS = 2000
CLOCKS = ("real", "sim")  # the edit session's two clocks
# The agent's default: a shard that has not arrived by then fails the edit (bandwidth collapse). Here, not in
# agent.py, so that `sakura device` (device_bridge.cli) gets its option default without importing the agent.
DEFAULT_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------------------- the job
@dataclass(frozen=True)
class NetworkSpec:
    trace: str = "5g"  # 5g | 4g5g | wifi | lte | fixed:<Mbps>, or an uploaded trace's display name
    start: float | None = None
    scale: float | None = None
    regime: str = "paper"
    upload: TraceUpload | None = None

    def to_wire(self) -> dict:
        return {"trace": self.trace, "start": self.start, "scale": self.scale, "regime": self.regime,
                "samples": self.upload.to_wire() if self.upload else None}

    @cached_property
    def link_trace(self) -> Trace:
        """The (unscaled) trace, loaded once: by the validator, then used by the edit."""
        if self.upload is not None:
            return self.upload.trace()
        return load_trace(self.trace)

    def network(self, start: float | None = None):
        """The runtime's :class:`~sakura.runtime.session.Network` this spec stands for (``start`` overrides
        the spec's offset: an edit that continues a prefetch's link). The protocol only serialises it."""
        from sakura.runtime.session import Network  # the runtime loads torch; the app reads this module without

        return Network(self.link_trace, self.trace, self.start if start is None else start, self.scale, self.regime)


@dataclass(frozen=True)
class Job:
    template_id: str
    system: str = "sakura"
    prompt: str = ""
    photo: Photo | None = None
    network: NetworkSpec = field(default_factory=NetworkSpec)
    reference_output: bool = True
    catalog_request: int | None = None  # use the template's evaluation request #i as the input (user studies)
    prefetch: bool = True  # sakura may use the pack bytes prefetched when the template was picked
    clock: str = "real"  # real: bytes paced along the trace, compute as it runs; sim: the calibrated replay

    def to_wire(self) -> dict:
        return {"template_id": self.template_id, "system": self.system, "prompt": self.prompt,
                "photo": self.photo.to_wire() if self.photo else None, "network": self.network.to_wire(),
                "reference_output": self.reference_output, "catalog_request": self.catalog_request,
                "prefetch": self.prefetch, "clock": self.clock}


def _number(value: Any, what: str, *, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EditRejected(f"network.{what} must be a number or null")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise EditRejected(f"network.{what} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return v


def _network(net: Any) -> NetworkSpec:
    if net is None:
        return NetworkSpec()
    if isinstance(net, NetworkSpec):
        net = {"trace": net.trace, "start": net.start, "scale": net.scale, "regime": net.regime, "upload": net.upload}
    if not isinstance(net, dict):
        raise EditRejected('network must be an object like {"trace": "5g", "start": null, "scale": null, '
                           '"regime": "paper"}')
    trace = net.get("trace", "5g")
    if not isinstance(trace, str) or not trace.strip():
        raise EditRejected("network.trace must be a trace name (5g, 4g5g, wifi, fixed:<Mbps>) or an uploaded trace")
    regime = net.get("regime") or "paper"
    if regime not in REGIMES:
        raise EditRejected(f"network.regime must be one of {', '.join(REGIMES)}, got {regime!r}")
    upload = net.get("upload")
    if upload is None and net.get("samples") is not None:
        upload = TraceUpload.from_wire(net["samples"])
    elif upload is None and net.get("trace_csv") is not None:  # a client that sent the file's text
        if not isinstance(net["trace_csv"], str):
            raise EditRejected("network.trace_csv must be the trace file's text")
        upload = TraceUpload.from_text(net["trace_csv"], Path(trace).name[:80] or "uploaded")
    trace = trace.strip()
    if upload is None and trace not in SYNTHETIC_NAMES and not trace.startswith("fixed:"):
        # Only named profiles or uploaded samples: a device never opens a file because a job names it.
        raise EditRejected(f"unknown network trace {trace[:80]!r}: use {', '.join(SYNTHETIC_NAMES)}, fixed:<Mbps>, "
                           "or upload the trace's samples")
    spec = NetworkSpec(trace, _number(net.get("start"), "start"), _number(net.get("scale"), "scale", positive=True),
                       regime, upload)
    try:
        spec.link_trace  # noqa: B018 - loads (and so validates) the trace once
    except TraceError as e:
        raise EditRejected(f"bad network trace: {one_line(e)}") from None
    return spec


parse_network = _network  # a job's network object on its own (prefetch on template pick)


def parse_job(job: Any, catalog) -> tuple[Job, Any]:
    """The one validator: a :class:`Job` or its JSON form → (Job, catalog template), or :class:`EditRejected`."""
    from_wire = not isinstance(job, Job)
    if from_wire and not isinstance(job, dict):
        raise EditRejected("the job must be a JSON object")
    get = (lambda k, d=None: job.get(k, d)) if from_wire else (lambda k, d=None: getattr(job, k, d))
    tid = get("template_id")
    if not isinstance(tid, str) or not tid.strip():
        raise EditRejected("template_id is missing")
    try:
        template = catalog.get(tid.strip())
    except KeyError as e:  # UnknownTemplateError
        raise EditRejected(one_line(str(e).strip("'\""))) from None
    system = get("system") or "sakura"
    if not isinstance(system, str) or system not in SYSTEMS:
        raise EditRejected(f"unknown system {system!r}; choose one of {', '.join(SYSTEMS)}")
    prompt = get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise EditRejected("prompt must be a string or null")
    prompt = (prompt or "").strip()
    if len(prompt) > MAX_PROMPT_CHARS:
        raise EditRejected(f"the instruction is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS})")
    catalog_request = get("catalog_request")
    if catalog_request is not None and (isinstance(catalog_request, bool) or not isinstance(catalog_request, int)
                                        or not 0 <= catalog_request < len(template.eval_requests)):
        raise EditRejected(f"catalog_request must be an evaluation request index of {template.id} "
                           f"(0..{len(template.eval_requests) - 1})")
    photo = _photo(get, from_wire) if template.task != "mb" else None
    if template.task == "mb" and not prompt and catalog_request is None:
        raise EditRejected(f"template {template.id} is a text edit: please type an instruction (the prompt is empty)")
    if template.task != "mb" and photo is None and catalog_request is None:
        what = "a face photo" if template.task == "fs" else "a garment photo"
        raise EditRejected(f"template {template.id} needs {what}: please upload an image")
    ref_out, prefetch = get("reference_output", True), get("prefetch", True)
    if not isinstance(ref_out, bool) or not isinstance(prefetch, bool):
        raise EditRejected("reference_output and prefetch must be true or false")
    clock = get("clock", "real")
    if clock not in CLOCKS:
        raise EditRejected(f"clock must be one of {', '.join(CLOCKS)}, got {one_line(repr(clock), 40)}")
    return Job(template.id, get_system(system).name, prompt if template.task == "mb" else "", photo,
               _network(get("network")), ref_out, catalog_request, prefetch, clock), template


def _photo(get, from_wire: bool) -> Photo | None:
    photo = get("photo")
    if isinstance(photo, Photo):
        return photo
    if photo is not None:
        return Photo.from_wire(photo)
    b64 = get("reference_png_b64") if from_wire else None  # a client that sent the file itself
    if b64 is None or (isinstance(b64, str) and not b64.strip()):
        return None
    if not isinstance(b64, str):
        raise EditRejected("reference_png_b64 must be a base64 string")
    return Photo.from_bytes(b64_field(b64, "reference_png_b64", MAX_PHOTO_BYTES), "the photo")


# ------------------------------------------------------------------------------------ the events
def event(kind: str, **fields) -> dict:
    """An agent-level event (``queued``, ``accepted``, ``status``, ``plan``, ``output``, ``result``, ``error``)."""
    return jsonable({"type": kind, **fields})


@dataclass
class EditProgress:
    """Everything the events of one edit said, folded: its timeline (the runtime's own model), its
    plan, where it stands. The app draws this; it never keeps a second timeline of its own."""

    system: str = ""
    timeline: Timeline = field(default_factory=lambda: Timeline("", "real"))
    plan: dict = field(default_factory=dict)
    accepted: bool = False
    output: dict | None = None  # the ``output`` event: the edited image before its reference and metrics
    result: dict | None = None
    error: str | None = None
    status: str = ""
    now: float = 0.0

    @property
    def planned(self) -> bool:
        return bool(self.plan)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def apply(self, ev: dict) -> None:
        kind, t = ev.get("type"), ev.get("t")
        if isinstance(t, (int, float)):
            self.now = max(self.now, float(t))
        if kind == "accepted":
            self.accepted = True
        elif kind == "plan":
            self.plan = dict(ev)
            self.timeline = Timeline.for_shards(self.system or str(ev.get("system", "")), "real",
                                                [tuple(s) for s in ev.get("shards") or []],
                                                trace_start_s=float(ev.get("trace_start") or 0.0))
        elif kind in ("status", "queued"):
            self.status = str(ev.get("message") or "")
        elif kind == "output":
            self.output = ev
            self._latency((ev.get("summary") or {}).get("latency_s"))
        elif kind == "result":
            self.result = ev
            if isinstance(ev.get("timeline"), dict):
                try:
                    self.timeline = Timeline.from_dict(ev["timeline"])
                except (TypeError, ValueError, KeyError):  # a malformed one: the events' timeline stays
                    pass
            self._latency((ev.get("summary") or {}).get("latency_s"))
        elif kind == "error":
            self.error = str(ev.get("message", "error"))
        else:
            self.timeline.apply(ev)

    def _latency(self, lat) -> None:
        if isinstance(lat, (int, float)):
            self.timeline.latency_s = float(lat)
            self.now = max(self.now, float(lat))

    def status_line(self) -> str:
        if self.error:
            return f"{self.system}: failed: {self.error}"
        if not self.accepted:
            return f"{self.system}: waiting for the device…"
        if not self.planned:
            return f"{self.system}: device is planning (measuring compute, reading pack headers)…" + (
                f" · {self.status}" if self.status else "")
        tl = self.timeline
        done = sum(1 for s in tl.shards if s.exec_end_t is not None)
        arrived = sum(1 for u in tl.units if u.arrival_t is not None)
        held = self.plan.get("prefetched") or {}
        on_device = (
            f" · {held['bytes'] / 1e6:.2f} MB were on the device at Run (prefetched)" if held.get("bytes") else ""
        )
        fired = {}
        for f in tl.fallbacks:
            fired[f["kind"]] = fired.get(f["kind"], 0) + 1
        fallbacks = (" · fallbacks " + ", ".join(f"{k} ×{n}" for k, n in fired.items())) if fired else ""
        return (f"{self.system}: t = {self.now:.2f} s · shards executed {done}/{len(tl.shards)} · cache units "
                f"received {arrived}/{len(self.plan.get('units') or [])} ({tl.bytes_received / 1e6:.2f} MB) · "
                f"stalls {tl.stall_s:.2f} s{on_device}{fallbacks}")
