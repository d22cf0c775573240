"""Device backends by name: the one place ``--executor`` / ``--reconstructor`` become objects.

Every caller (``sakura edit --stream``, the device agent, the demo, ``sakura bench``) hands a
:class:`BackendChoice` to the :class:`~sakura.runtime.session.DeviceRuntime`; the runtime asks this
module's :class:`Backends` for a template's executor and reconstructor, and every edit session gets
them the same way. What ran is a :class:`BackendsRan` record (in the plan, the summary, the bench rows).

* Executors: ``eager`` (PyTorch) or ``executorch`` (one ExecuTorch program per shard, XNNPACK
  delegate). Shard programs exist for the Flux2 family only: another model (the SD3 template) runs
  eager, and the record says so. An exported executor runs fixed masked programs, so the local
  fallback (every token from a step on) is off with it (``EditSession.fallback_context``).
* Reconstructors: ``torch`` (numpy unpacking + BLAS) or ``opencl`` (bit-plane kernels).
* ``auto``: the phone-style stack (``executorch`` + ``opencl``) where it works on this machine,
  else ``eager`` / ``torch``, with the reason.
* ``qnn`` (Snapdragon HTP programs) runs only on the phone: asked for here it is a one-line error.

Programs are exported once per (weights, ExecuTorch version, shard size, codec) into
``<programs>/<model>-<key>/`` beside the packs (:func:`program_dir`); export progress goes to the
caller's status sink. A missing backend is a :class:`BackendUnavailable` whose one line names the
fallback to use.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from sakura.runtime.executors.errors import BackendUnavailable

AUTO = "auto"
EXECUTOR_NAMES = ("eager", "executorch")
RECONSTRUCTOR_NAMES = ("torch", "opencl")
EXECUTOR_TITLES = {"eager": "eager PyTorch", "executorch": "ExecuTorch (XNNPACK)", "qnn": "ExecuTorch (QNN)"}
RECONSTRUCTOR_TITLES = {"torch": "torch (numpy unpack + BLAS)", "opencl": "OpenCL"}
EXPORTABLE_FAMILIES = ("flux2",)  # model families with shard programs (sakura.runtime.executors.flux2)
WHERE = "host CPU"  # where the demo's and the bench's device backends run (no phone is attached here)
NO_LOCAL = "local fallback off: the exported programs run fixed masked graphs"
StatusSink = Callable[[str, str], None]


@dataclass(frozen=True)
class BackendChoice:
    """What the user asked for: executor and reconstructor names (or ``auto``), and where exported
    programs are kept (None: ``~/.cache/sakura/programs``)."""

    executor: str = "eager"
    reconstructor: str = "torch"
    programs_dir: Path | None = None
    offload: tuple[tuple[int, int], ...] | None = None  # executorch: the layer ranges run as programs (None: all)

    def __post_init__(self) -> None:
        if self.executor not in (*EXECUTOR_NAMES, "qnn", AUTO):
            raise ValueError(f"unknown executor {self.executor!r}; choose one of {', '.join(EXECUTOR_NAMES)} or auto")
        if self.reconstructor not in (*RECONSTRUCTOR_NAMES, AUTO):
            raise ValueError(f"unknown reconstructor {self.reconstructor!r}; choose one of "
                             f"{', '.join(RECONSTRUCTOR_NAMES)} or auto")

    @property
    def label(self) -> str:
        return f"{self.executor}+{self.reconstructor}"


@dataclass(frozen=True)
class BackendsRan:
    """What one edit (or bench row) ran on: names, titles for people, and why it differs from the ask."""

    executor: str  # eager | executorch
    reconstructor: str  # torch | opencl
    executor_title: str
    reconstructor_title: str
    asked: str  # "executor+reconstructor" as asked (auto included)
    where: str = WHERE
    note: str = ""  # a fallback taken and why (e.g. an SD3 model runs eager)
    local_fallback: bool = True  # False with exported programs

    @property
    def label(self) -> str:
        return f"{self.executor}+{self.reconstructor}"

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}

    def line(self) -> str:
        """One line for people: "ExecuTorch (XNNPACK) + OpenCL (…) on the host CPU; …"."""
        extra = [x for x in (self.note, "" if self.local_fallback else NO_LOCAL) if x]
        return (f"{self.executor_title} + {self.reconstructor_title} on the {self.where}"
                + (f" ({'; '.join(extra)})" if extra else ""))


def unavailable_executor(name: str, why: str) -> BackendUnavailable:
    return BackendUnavailable(f"executor {name} is unavailable: {_one_line(why)}; use --executor eager")


def unavailable_reconstructor(name: str, why: str) -> BackendUnavailable:
    return BackendUnavailable(f"reconstructor {name} is unavailable: {_one_line(why)}; use --reconstructor torch")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def default_programs_dir() -> Path:
    from sakura.runtime.reconstruct import cache_dir  # (its module imports OpenCL helpers; cheap)

    return cache_dir() / "programs"


def programs_beside(packs) -> Path | None:
    """Where programs are kept beside a pack folder (None for an object store: the user cache then)."""
    if packs is None or "://" in str(packs):
        return None
    return Path(packs) / "programs"


def program_key(model, shard_size: int, et_version: str) -> str:
    """Hash of what an exported program depends on beyond its shard's geometry: the weights, the
    ExecuTorch (and torch) version, the shard size and the codec. New weights, a new toolchain or
    another codec give another key, so stale programs are never loaded."""
    import torch

    from sakura.runtime.executors.executorch_backend import weights_fingerprint  # torch-only helper

    codec = getattr(model, "codec", None)
    codec_text = json.dumps(asdict(codec) if hasattr(codec, "__dataclass_fields__") else repr(codec),
                            sort_keys=True, default=str)
    text = json.dumps({"weights": weights_fingerprint(model.transformer), "executorch": et_version,
                       "torch": torch.__version__, "shard_size": int(shard_size), "codec": codec_text},
                      sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def program_dir(root: Path, model, shard_size: int, et_version: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.model_id) or "model"
    return Path(root) / f"{safe}-s{shard_size}-{program_key(model, shard_size, et_version)}"


class Backends:
    """Resolves a :class:`BackendChoice` once per process and hands each template its executor and
    reconstructor (the reconstructor is shared; an executor is made per model, its programs exported
    on first use and cached on disk). Thread-safe."""

    def __init__(self, choice: BackendChoice | None = None) -> None:
        self.choice = choice or BackendChoice()
        self._lock = threading.Lock()
        self._reconstructor = None
        self._reconstructor_name: str | None = None
        self._reconstructor_note = ""
        self._executors: dict[tuple[str, int], tuple[object, BackendsRan]] = {}
        self._et_version: str | None = None
        self._et_problem: str | None = None

    # -------------------------------------------------------------------------------- probing
    def check(self) -> dict:
        """Resolve what can be resolved without a model (the reconstructor; ExecuTorch's import) so a
        missing backend fails at start, in one line. Returns {"executor": name, "reconstructor": name}."""
        self._resolve_reconstructor()
        return {"executor": self._executor_name(None), "reconstructor": self._reconstructor_name}

    def _executorch_version(self) -> str | None:
        if self._et_version is None and self._et_problem is None:
            from sakura.runtime.executors.executorch_backend import require_executorch  # (imports executorch)

            try:
                self._et_version = require_executorch()
            except BackendUnavailable as e:
                self._et_problem = str(e)
        return self._et_version

    def _executor_name(self, model) -> str:
        asked = self.choice.executor
        if asked == "qnn":
            from sakura.runtime.executors.executorch_backend import check_qnn_sdk  # checks the SDK, imports nothing

            try:
                check_qnn_sdk()
            except BackendUnavailable as e:
                raise unavailable_executor("qnn", str(e)) from None
            raise unavailable_executor("qnn", "QNN programs run on a Snapdragon phone, not on this host "
                                       "(export them with `sakura export --backend qnn`)")
        if asked == "eager":
            return "eager"
        if self._executorch_version() is None:
            if asked == AUTO:
                return "eager"
            raise unavailable_executor("executorch", self._et_problem or "")
        return "executorch"

    def _resolve_reconstructor(self):
        with self._lock:
            if self._reconstructor_name is not None:
                return self._reconstructor
            from sakura.runtime.reconstruct import get_reconstructor  # OpenCL loads here, once

            asked = self.choice.reconstructor
            name = "opencl" if asked == AUTO else asked
            rec, note = None, ""
            if name == "opencl":
                try:
                    rec = get_reconstructor("opencl")
                except BackendUnavailable as e:
                    if asked != AUTO:
                        raise unavailable_reconstructor("opencl", str(e)) from None
                    name, note = "torch", f"OpenCL unavailable ({_one_line(e)})"
            self._reconstructor = rec  # None: the encoding's own torch decoder
            self._reconstructor_name, self._reconstructor_note = name, note
            return rec

    @property
    def reconstructor_note(self) -> str:
        return self._reconstructor_note

    @property
    def note(self) -> str:
        """Why the device's stack differs from what was asked (``auto`` falling back), before any template."""
        executor = (f"ExecuTorch unavailable ({_one_line(self._et_problem)})"
                    if self.choice.executor == AUTO and self._et_problem else "")
        return "; ".join(x for x in (self._reconstructor_note, executor) if x)

    def reconstructor_title(self) -> str:
        if self._reconstructor_name == "opencl":
            dev = getattr(self._reconstructor, "device_name", "")
            return f"OpenCL ({dev})" if dev else "OpenCL"
        return RECONSTRUCTOR_TITLES["torch"]

    def planned(self, model) -> dict:
        """What a template of ``model`` would run on (names, titles, note), without exporting anything."""
        name = self._executor_name(model)
        family = getattr(model, "family", "") or type(model).__name__
        note = self._reconstructor_note
        if name == "executorch" and family not in EXPORTABLE_FAMILIES:
            name = "eager"
            note = "; ".join(x for x in (note, f"ExecuTorch shard programs cover the Flux2 family; {model.model_id} "
                                         f"({family}) runs eager PyTorch") if x)
        self._resolve_reconstructor()
        return {"executor": name, "reconstructor": self._reconstructor_name, "executor_title": EXECUTOR_TITLES[name],
                "reconstructor_title": self.reconstructor_title(), "where": WHERE, "note": note,
                "local_fallback": name == "eager"}

    # ---------------------------------------------------------------------------- per template
    def for_model(self, model, shard_size: int, example_request=None,
                  on_status: StatusSink | None = None) -> tuple[object | None, object | None, BackendsRan]:
        """(executor or None for the eager masked run, reconstructor or None for torch, the record).
        ``example_request``: a request of the template's geometry; with it, every shard program is
        exported (or loaded from the cache) now, not in the first edit's latency."""
        rec = self._resolve_reconstructor()
        key = (model.model_id, id(model))
        with self._lock:
            known = self._executors.get(key)
        if known is None:
            known = self._make_executor(model, on_status)
            with self._lock:
                self._executors[key] = known
        executor, ran = known
        if executor is not None and example_request is not None:
            self._ensure_programs(executor, model, example_request, shard_size, on_status)
        return executor, rec, ran

    def _make_executor(self, model, on_status) -> tuple[object | None, BackendsRan]:
        name = self._executor_name(model)
        note = self._reconstructor_note
        family = getattr(model, "family", "") or type(model).__name__
        if name == "executorch" and family not in EXPORTABLE_FAMILIES:
            name = "eager"
            note = "; ".join(x for x in (note, f"ExecuTorch shard programs cover the Flux2 family; {model.model_id} "
                                         f"({family}) runs eager PyTorch") if x)
        elif self.choice.executor == AUTO and name == "eager" and self._et_problem:
            note = "; ".join(x for x in (note, f"ExecuTorch unavailable ({_one_line(self._et_problem)})") if x)
        executor = None
        if name == "executorch":
            from sakura.runtime.executors import get_executor  # ExecuTorch: only when it is asked for

            executor = get_executor("executorch", model, cache_dir=None, offload=self.choice.offload,
                                    log=(lambda msg: on_status("exporting", msg)) if on_status else None)
            if self.choice.offload is not None:
                shown = ", ".join(f"[{a}, {b})" for a, b in self.choice.offload)
                note = "; ".join(x for x in (note, f"programs for layers {shown} only, the other shards eager") if x)
        ran = BackendsRan(name, self._reconstructor_name or "torch", EXECUTOR_TITLES[name], self.reconstructor_title(),
                          self.choice.label, note=note, local_fallback=executor is None)
        return executor, ran

    def _ensure_programs(self, executor, model, req, shard_size: int, on_status) -> None:
        """Point the executor at this model's program folder and export (or load) every shard now."""
        root = self.choice.programs_dir or default_programs_dir()
        folder = program_dir(root, model, shard_size, self._executorch_version() or "unknown")
        executor.cache_dir = folder
        if on_status:
            executor.log = lambda msg: on_status("exporting", f"ExecuTorch: {msg} (once per weights, in {folder})")
        missing = not folder.is_dir() or not any(folder.glob("*.pte"))
        if on_status and missing:
            on_status("exporting", f"exporting ExecuTorch shard programs for {model.model_id} into {folder} "
                      "(first time only: minutes)")
        executor.prepare(req, shard_size, load=True)
        if on_status and missing:
            on_status("exporting", f"ExecuTorch programs ready for {model.model_id}")


def ran_for(executor, reconstructor, asked: str = "") -> BackendsRan:
    """The record of backends a caller handed in as objects (None: eager / torch)."""
    ex = getattr(executor, "name", "") or "eager"
    rc = getattr(reconstructor, "name", "") or "torch"
    rc_title = RECONSTRUCTOR_TITLES.get(rc, rc)
    if rc == "opencl" and getattr(reconstructor, "device_name", ""):
        rc_title = f"OpenCL ({reconstructor.device_name})"
    return BackendsRan(ex, rc, EXECUTOR_TITLES.get(ex, ex), rc_title, asked or f"{ex}+{rc}",
                       local_fallback=executor is None)


def eager_only(ran: BackendsRan, why: str) -> BackendsRan:
    """The same record for a run that executes with the eager model whatever was asked (local, oracle)."""
    if ran.executor == "eager":
        return ran
    return BackendsRan("eager", ran.reconstructor, EXECUTOR_TITLES["eager"], ran.reconstructor_title, ran.asked,
                       ran.where, "; ".join(x for x in (ran.note, why) if x), True)
