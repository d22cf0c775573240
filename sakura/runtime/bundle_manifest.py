"""A phone bundle's manifest (:mod:`sakura.runtime.bundle`): the records ``manifest.json`` holds, and reading
and checking a bundle's files against it: what a device-side tool or a test reads first."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from sakura.runtime.bundle_folder import BundleError

MANIFEST = "manifest.json"
BUNDLE_VERSION = 1
HEADER_FORMATS = ("sakura", "fp16")  # the stream the device plans (sakura) and the shard plan / reference (fp16)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> "TensorSpec":
        return cls(name, tuple(int(x) for x in t.shape), str(t.dtype).removeprefix("torch."))


@dataclass(frozen=True)
class BundleFile:
    path: str  # relative to the bundle folder, '/'-separated
    role: str  # program | tensor | header
    bytes: int
    sha256: str
    inputs: tuple[TensorSpec, ...] = ()  # programs: positional inputs; tensors: the one stored tensor
    outputs: tuple[TensorSpec, ...] = ()
    note: str = ""
    export_s: float | None = None
    max_abs_vs_eager: float | None = None


@dataclass(frozen=True)
class ChainCall:
    """One program call: ``outputs = program(*inputs)``; names are values of the run (see ``BundleManifest.values``)."""

    program: str  # a file of role "program"
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    when: str  # request | step | finish
    layers: tuple[int, int] | None = None  # shards: the cache layers [l0, l1) whose K/V it takes


@dataclass
class BundleManifest:
    template_id: str
    task: str
    model_id: str
    family: str
    shard_size: int
    num_steps: int
    num_layers: int
    executorch: str
    torch: str
    weights: dict[str, str]  # part -> sha1 of its weights
    geometry: dict
    tokenizer: dict
    reference: dict  # how the runner prepares the user's reference image ({} for text edits)
    stream: dict  # where the streamed K/V come from and how they enter
    values: dict[str, str]  # every value name of the chain -> where it comes from
    chain: list[ChainCall]
    files: list[BundleFile]
    total_bytes: int = 0
    version: int = BUNDLE_VERSION
    created_s: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "BundleManifest":
        d = dict(d)
        spec = lambda xs: tuple(TensorSpec(x["name"], tuple(x["shape"]), x["dtype"]) for x in xs)  # noqa: E731
        d["files"] = [BundleFile(**{**f, "inputs": spec(f["inputs"]), "outputs": spec(f["outputs"])})
                      for f in d["files"]]
        d["chain"] = [ChainCall(c["program"], tuple(c["inputs"]), tuple(c["outputs"]), c["when"],
                                tuple(c["layers"]) if c.get("layers") else None) for c in d["chain"]]
        return cls(**d)

    def file(self, path: str) -> BundleFile:
        for f in self.files:
            if f.path == path:
                return f
        raise BundleError(f"the bundle's manifest lists no {path}")


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def load_manifest(folder: Path) -> BundleManifest:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{folder} is not a bundle (no {MANIFEST})")
    return BundleManifest.from_dict(json.loads(path.read_text()))


def verify_files(folder: Path, manifest: BundleManifest | None = None) -> list[str]:
    """Problems with the files against the manifest (size, sha256, unlisted files); empty when it all matches."""
    folder = Path(folder)
    manifest = manifest or load_manifest(folder)
    problems = []
    listed = {f.path for f in manifest.files}
    for f in manifest.files:
        p = folder / f.path
        if not p.is_file():
            problems.append(f"{f.path}: missing")
        elif p.stat().st_size != f.bytes:
            problems.append(f"{f.path}: {p.stat().st_size} bytes, the manifest says {f.bytes}")
        elif sha256_of(p) != f.sha256:
            problems.append(f"{f.path}: sha256 differs from the manifest")
    for p in folder.rglob("*"):
        if p.is_file() and p.name != MANIFEST and relative(p, folder) not in listed:
            problems.append(f"{relative(p, folder)}: not in the manifest")
    return problems
