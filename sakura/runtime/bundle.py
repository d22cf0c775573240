"""A phone bundle: everything a phone needs to run one template's streamed edit, as ExecuTorch programs + files.

``sakura export -t TEMPLATE --bundle DIR`` writes::

    DIR/manifest.json            every file (size, sha256, role, input/output shapes and dtypes), the
                                 ExecuTorch / torch versions, the weights hash, the tokenizer, and how
                                 the programs chain per request, per step and at the end (``chain``)
    DIR/programs/*.pte           XNNPACK programs: text_encoder, text_conditioning, reference (fs / vton),
                                 step_pre, shard_L<a>_<b> (one per cache shard), step_post, finish
    DIR/template/*.bin           the template's request-constant tensors, raw little-endian (shape and
                                 dtype in the manifest): conditioning and mask rows, the template noise of
                                 the masked rows, RoPE tables, sigmas, the template image and mask, ...
    DIR/header/*.header          the stored packs' headers (``8-byte length + header``) the device plans
                                 its byte ranges with

The programs are the pieces of :class:`~sakura.runtime.executors.flux2.Flux2Run` (the shard executor the
device runs today): ``step_pre`` is its ``begin_step`` (input projection, time + instruction embedding,
modulations), the shards its ``run_shard`` (the same cached programs :mod:`sakura.runtime.backends` exports:
``export_shards`` into ``program_dir``), ``step_post`` its ``end_step`` (output norm / projection and the
flow-matching update); ``text_encoder`` + ``text_conditioning`` and ``reference`` are its per-request setup,
``finish`` its image. Attention in every graph is the explicit ``softmax(QKᵀ)V`` (XNNPACK takes it whole).

The manifest's records and the file checks are :mod:`sakura.runtime.bundle_manifest`, the exported modules
:mod:`sakura.runtime.bundle_programs`; this module writes a bundle. :class:`BundleRunner` runs a bundle from its
manifest alone with the ExecuTorch runtime: the reference for an Android runner (docs/device-backends.md) and
what the tests compare against the eager edit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from sakura.model.base import DiTAdapter, EditRequest
from sakura.model.pixels import mask_bbox, resize_bilinear
from sakura.model.text_encoder import BOS, PAD, tokenize
from sakura.runtime.bundle_folder import BundleError, prepare_folder, publish
from sakura.runtime.bundle_manifest import (
    HEADER_FORMATS,
    MANIFEST,
    BundleFile,
    BundleManifest,
    ChainCall,
    TensorSpec,
    load_manifest,
    relative,
    sha256_of,
)
from sakura.runtime.bundle_programs import (
    AlignedReference,
    Finish,
    ReferenceTokens,
    StepPost,
    StepPre,
    TextConditioning,
    TextEncoderProgram,
    bare_time_embedding,
)

Progress = Callable[[str, int, int], None]  # (what is being written, parts done, parts in all)


def _save_tensor(root: Path, name: str, t: torch.Tensor, note: str) -> BundleFile:
    path = root / "template" / f"{name}.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = t.detach().contiguous().numpy()
    path.write_bytes(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
    return BundleFile(relative(path, root), "tensor", path.stat().st_size, sha256_of(path),
                      (TensorSpec.of(name, t),), (), note)


def _tensor_note(name: str) -> str:
    return {
        "cond_rows": "template conditioning of the masked rows (N_masked, patch·patch·3)",
        "mask_rows": "pixel mask of the masked rows' patches (N_masked, patch·patch)",
        "noise_rows": "the template noise of the masked rows: the state x_rows at step 0",
        "cos": "RoPE cos table of the [text, masked image (, reference)] sequence",
        "sin": "RoPE sin table of the same sequence",
        "sigmas": "flow-matching sigmas (steps + 1): t = sigmas[step], dt = sigmas[step+1] - sigmas[step]",
        "template": "the template image (H, W, 3) in [0, 1]",
        "mask": "the edit mask (H, W, 1), 1 inside",
        "rows": "image-token ids of the masked rows, in row order of every *_rows tensor",
        "reuse": "image-token ids of the reusable rows: the row order of every streamed K/V (n, heads·head_dim)",
    }.get(name, "")


def read_headers(source, template_id: str) -> dict[str, bytes]:
    """The pack headers a bundle carries (``{file id: 8-byte length + header}``) from ``source`` (anything with
    ``header_bytes(file_id)``: a pack folder's or store's source, a range client); one line when one is missing."""
    from sakura.formats import file_id  # (the formats registry: only a writer needs it)

    headers = {}
    for fmt in HEADER_FORMATS:
        fid = file_id(template_id, fmt)
        try:
            headers[fid] = source.header_bytes(fid)
        except Exception as e:  # noqa: BLE001 - one line naming what to build
            why = " ".join(str(getattr(e, "args", [e])[-1]).split())
            raise BundleError(f"no packs for {template_id} ({fid}.pack: {why}): build them with "
                              f"`sakura build --templates {template_id}` or pass --packs") from None
    return headers


def write_bundle(adapter: DiTAdapter, template, req: EditRequest, out: Path, *, shard_size: int,
                 headers: Mapping[str, bytes] | None = None, programs_dir: Path | None = None, force: bool = False,
                 progress: Progress | None = None) -> BundleManifest:
    """Export ``template``'s phone bundle into ``out`` (see the module doc). ``req``: a request of the template's
    geometry (its prompt / reference only give example inputs). ``headers``: the pack headers to carry
    (:func:`read_headers`); ``programs_dir``: the shard-program cache root (``sakura.runtime.backends``)."""
    from sakura.runtime.backends import default_programs_dir, program_dir  # (a reader of bundles needs neither)
    from sakura.runtime.executors.executorch_backend import (  # ExecuTorch: only when a bundle is written
        _hash_weights,
        require_executorch,
        weights_fingerprint,
    )

    if getattr(adapter, "family", "") != "flux2":
        raise BundleError(f"phone bundles cover the Flux2 family (its shard programs); {adapter.model_id} is "
                          f"{getattr(adapter, 'family', '') or type(adapter).__name__}")
    et_version = require_executorch()
    headers = dict(headers or {})
    stage = prepare_folder(out, force)
    try:
        manifest = _write(adapter, template, req, stage, shard_size, headers,
                          program_dir(programs_dir or default_programs_dir(), adapter, shard_size, et_version),
                          et_version, progress, {"transformer": weights_fingerprint(adapter.transformer),
                                                 "text_encoder": _hash_weights(adapter.text_encoder)})
        publish(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return manifest


def _write(adapter, template, req, root: Path, shard_size: int, headers: dict[str, bytes], shard_cache: Path,
           et_version: str, progress: Progress | None, weights: dict[str, str]) -> BundleManifest:
    from sakura.runtime.executors.eager import EagerExecutor  # (loads the shard-run machinery: writers only)
    from sakura.runtime.executors.executorch_backend import ensure_exported, export_module  # ExecuTorch (heavy)

    codec = adapter.codec
    run = EagerExecutor(adapter, explicit=True).prepare(req, shard_size, load=False)
    files: list[BundleFile] = []
    chain: list[ChainCall] = []
    values: dict[str, str] = {}
    task = req.task
    has_ref = task in ("fs", "vton") and req.reference is not None
    aligned, ref_tokens = has_ref and codec.ref_aligned, has_ref and codec.ref_tokens
    instruction = adapter.text_encoder.instruction_proj is not None
    M = int(run.rows.numel())
    parts = (2 + int(has_ref) + 3 + len(run.layer_ranges)) + 1  # programs + the files
    done = 0

    def tick(what: str) -> None:
        if progress:
            progress(what, done, parts)

    def program(name: str, module: nn.Module, inputs: tuple, in_names, out_names, when: str, note: str) -> None:
        nonlocal done
        tick(f"exporting {name}")
        path = root / "programs" / f"{name}.pte"
        inputs = tuple(t.contiguous() for t in inputs)
        with torch.no_grad():
            outs = module(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        meta = export_module(module, inputs, path, what=name)
        files.append(BundleFile(relative(path, root), "program", meta["bytes"], sha256_of(path),
                                tuple(TensorSpec.of(n, t) for n, t in zip(in_names, inputs)),
                                tuple(TensorSpec.of(n, t) for n, t in zip(out_names, outs)), note,
                                meta["export_s"], meta["max_abs_vs_eager"]))
        chain.append(ChainCall(f"programs/{name}.pte", tuple(in_names), tuple(out_names), when))
        done += 1

    # -- template tensors (request-constant) ----------------------------------------------------
    tick("writing the template tensors")
    r = codec.resolution
    tensors = {
        "cond_rows": run.cond_rows, "mask_rows": run.mask_rows, "noise_rows": run.noise[run.rows],
        "cos": run.cos, "sin": run.sin, "sigmas": run.sig.float(),
        "template": torch.from_numpy(np.ascontiguousarray(req.template, dtype=np.float32)),
        "mask": torch.from_numpy(req.mask.astype(np.float32))[..., None],
        "rows": run.rows.long(), "reuse": run.reuse.long(),
    }
    for name, t in tensors.items():
        files.append(_save_tensor(root, name, t, _tensor_note(name)))
        values[name] = f"file template/{name}.bin"
    for fid, data in headers.items():
        path = root / "header" / f"{fid}.header"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files.append(BundleFile(relative(path, root), "header", len(data), sha256_of(path), note=(
            f"the header of {fid}.pack (8-byte little-endian length + header): levels, shards, byte ranges")))
    done += 1

    # -- per request: text, reference -----------------------------------------------------------
    ids = tokenize(req.prompt or "", adapter.text_encoder.cfg)[None]
    values["ids"] = "runner: tokenize(prompt) (manifest.tokenizer), (1, max_tokens) int64"
    text = TextEncoderProgram(adapter.text_encoder)
    program("text_encoder", text, (ids,), ["ids"], ["text_tokens", "text_pooled"], "request",
            "the text encoder: prompts are encoded on the device")
    with torch.no_grad():
        tokens, pooled = text(ids)
    cond_names = ["txt0"] + (["instruction"] if instruction else [])
    program("text_conditioning", TextConditioning(adapter), (tokens, pooled), ["text_tokens", "text_pooled"],
            cond_names, "request", "context_embedder (+ the instruction added to the time embedding)")
    reference: dict = {}
    ref_inputs: dict[str, torch.Tensor] = {}
    if aligned:
        y0, x0, y1, x1 = mask_bbox(req.mask)
        ref_bbox = torch.from_numpy(np.ascontiguousarray(resize_bilinear(req.reference, y1 - y0, x1 - x0)))
        module = AlignedReference(req.mask, run.rows, codec.patch)
        program("reference", module, (ref_bbox,), ["ref_bbox"], ["aligned_rows"], "request",
                "the user's reference, placed on the mask's bounding box, as the masked rows' tokens")
        with torch.no_grad():
            ref_inputs["aligned_rows"] = module(ref_bbox)
        reference = {"input": "ref_bbox", "size_hw": [y1 - y0, x1 - x0], "bbox_yxyx": [y0, x0, y1, x1],
                     "how": "the user's reference photo (RGB, float32 in [0, 1]), resized bilinearly with antialiasing "
                            "to size_hw (the mask's bounding box)"}
        values["ref_bbox"] = "runner: the reference photo resized to reference.size_hw, (h, w, 3) float32 in [0, 1]"
    elif ref_tokens:
        ref = torch.from_numpy(np.ascontiguousarray(resize_bilinear(req.reference, codec.ref_size, codec.ref_size)))
        module = ReferenceTokens(codec.patch, int(run.ref_feats.shape[1]))
        program("reference", module, (ref,), ["ref_image"], ["ref_feats"], "request",
                "the user's reference as tokens of its own")
        with torch.no_grad():
            ref_inputs["ref_feats"] = module(ref)
        reference = {"input": "ref_image", "size_hw": [codec.ref_size, codec.ref_size],
                     "how": "the user's reference photo resized to size_hw, float32 in [0, 1]"}
        values["ref_image"] = "runner: the reference photo resized to reference.size_hw, (h, w, 3) float32 in [0, 1]"

    # -- per step ---------------------------------------------------------------------------------
    values["x_rows"] = "state: noise_rows at step 0, then step_post's output"
    values["t"] = "runner: sigmas[step], (1,) float32"
    values["dt"] = "runner: sigmas[step + 1] - sigmas[step], (1,) float32"
    pre = StepPre(adapter, aligned, ref_tokens, instruction)
    sig = run.sig.float()
    pre_inputs = {"x_rows": tensors["noise_rows"], "cond_rows": run.cond_rows, "mask_rows": run.mask_rows,
                  **ref_inputs, "t": sig[:1].clone()}
    if instruction:
        with torch.no_grad():
            pre_inputs["instruction"] = TextConditioning(adapter)(tokens, pooled)[1]
    pre_out = ["img", "temb", "mod_img", "mod_txt", "mod_single"]
    with bare_time_embedding(adapter):
        program("step_pre", pre, tuple(pre_inputs[n] for n in pre.input_names), pre.input_names, pre_out, "step",
                "begin_step: image features → x_embedder; time (+ instruction) embedding → modulations")
        with torch.no_grad():
            img, temb, *_ = pre(*(pre_inputs[n] for n in pre.input_names))
    for i, (l0, l1) in enumerate(run.layer_ranges):
        tick(f"shard programs: layers [{l0}, {l1})")
        src, meta = ensure_exported(run, l0, l1, "xnnpack", shard_cache)
        path = root / "programs" / f"shard_L{l0}_{l1}.pte"
        shutil.copyfile(src, path)
        names = run.input_names(l0, l1)
        example = run.example_inputs(l0, l1)
        with torch.no_grad(), run.masked_context(True):
            outs = run.shard_module(l0, l1)(*example)
        files.append(BundleFile(relative(path, root), "program", path.stat().st_size, sha256_of(path),
                                tuple(TensorSpec.of(n, t) for n, t in zip(names, example)),
                                tuple(TensorSpec.of(n, t) for n, t in zip(("img", "txt"), outs)),
                                f"cache shard: blocks [{l0}, {l1}) on the streamed K/V of their layers "
                                f"({'cached' if meta.get('cached') else 'exported'} in {shard_cache})",
                                meta.get("export_s"), meta.get("max_abs_vs_eager")))
        ins = tuple("txt0" if (n == "txt" and i == 0) else n for n in names)
        chain.append(ChainCall(relative(path, root), ins, ("img", "txt"), "step", (l0, l1)))
        done += 1
    for layer in range(adapter.num_layers):
        values[f"k{layer}"] = f"stream: K of (step, layer {layer}) from the rebuilt cache shard, (n, heads·head_dim)"
        values[f"v{layer}"] = f"stream: V of (step, layer {layer}), same shape"
    post = StepPost(adapter, M)
    program("step_post", post, (img, temb, tensors["noise_rows"], (sig[1:2] - sig[:1]).clone()),
            ["img", "temb", "x_rows", "dt"], ["x_rows"], "step",
            "end_step: norm_out / proj_out → velocity of the masked rows → x_rows + dt · v")
    program("finish", Finish(run.rows, codec.patch, r), (tensors["noise_rows"], tensors["template"], tensors["mask"]),
            ["x_rows", "template", "mask"], ["image"], "finish", "the edited image (H, W, 3) in [0, 1]")
    for name in ("text_tokens", "text_pooled", "txt0", "instruction", "aligned_rows", "ref_feats", "img", "txt",
                 "temb", "mod_img", "mod_txt", "mod_single", "image"):
        values.setdefault(name, "output of the program that lists it")
    tick("writing the manifest")

    sig0 = run.signature(*run.layer_ranges[0])
    manifest = BundleManifest(
        template_id=template.id, task=task, model_id=adapter.model_id, family=adapter.family, shard_size=shard_size,
        num_steps=adapter.num_steps, num_layers=adapter.num_layers, executorch=et_version, torch=torch.__version__,
        weights=weights,
        geometry={"resolution": r, "patch": codec.patch, "masked_rows": M, "image_tokens": sig0.num_img,
                  "text_tokens": sig0.num_txt, "reusable_rows": sig0.num_reuse, "heads": sig0.heads,
                  "head_dim": sig0.head_dim, "layer_ranges": [list(x) for x in run.layer_ranges]},
        tokenizer={"kind": "crc32 word hash", "regex": "[a-z0-9]+ on the lower-cased prompt",
                   "id": "2 + crc32(word utf-8) % (vocab_size - 2)", "bos": BOS, "pad": PAD,
                   "vocab_size": adapter.text_encoder.cfg.vocab_size,
                   "max_tokens": adapter.text_encoder.cfg.max_tokens},
        reference=reference,
        stream={"headers": sorted(headers), "format": "sakura",
                "kv": "per (step, layer): K and V (n, heads·head_dim) float32 rebuilt from the streamed shard "
                      "(rows in template/reuse.bin order); shard program (l0, l1) of step s takes k<l>, v<l> of step s",
                "order": "shards are consumed in order: step 0 layers [0, shard_size), ... then step 1, ..."},
        values=values, chain=chain, files=files,
    )
    manifest.total_bytes = sum(f.bytes for f in files)
    (root / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=1))
    done = parts
    tick("done")
    return manifest


class BundleRunner:
    """Runs a bundle's chain with the ExecuTorch runtime, from its manifest alone (what a phone's runner does)::

        runner = BundleRunner(folder)
        values = runner.begin(prompt="...", reference=photo)   # per request: text, reference, state
        for step in range(runner.manifest.num_steps):
            runner.step(values, step, kv)                     # kv: {(step, layer): (K, V)} from the stream
        image = runner.finish(values)
    """

    def __init__(self, folder: Path) -> None:
        from executorch.runtime import Runtime

        self.folder = Path(folder)
        self.manifest = load_manifest(self.folder)
        self._runtime = Runtime.get()
        self._methods: dict[str, object] = {}
        self.calls: list[str] = []  # programs run, in order (the tests read it)

    def _method(self, path: str):
        if path not in self._methods:
            program = self._runtime.load_program(str(self.folder / path))
            self._methods[path] = (program, program.load_method("forward"))
        return self._methods[path][1]

    def tensor(self, name: str) -> torch.Tensor:
        f = self.manifest.file(f"template/{name}.bin")
        spec = f.inputs[0]
        arr = np.fromfile(self.folder / f.path, dtype=np.dtype(spec.dtype).newbyteorder("<"))
        return torch.from_numpy(arr.astype(spec.dtype).reshape(spec.shape))

    def _call(self, call: ChainCall, values: dict[str, torch.Tensor]) -> None:
        missing = [n for n in call.inputs if n not in values]
        if missing:
            raise BundleError(f"{call.program} needs {', '.join(missing)}, which nothing before it gave")
        outs = self._method(call.program).execute([values[n].contiguous() for n in call.inputs])
        for name, t in zip(call.outputs, outs):
            values[name] = t.clone()  # outputs live in the program's planned memory
        self.calls.append(call.program)

    def begin(self, prompt: str = "", reference_bbox: np.ndarray | None = None,
              reference_image: np.ndarray | None = None) -> dict[str, torch.Tensor]:
        from sakura.model.text_encoder import TextEncoderConfig  # (the tokenizer's settings, from the manifest)

        m = self.manifest
        cfg = TextEncoderConfig(vocab_size=m.tokenizer["vocab_size"], max_tokens=m.tokenizer["max_tokens"])
        values: dict[str, torch.Tensor] = {n: self.tensor(n) for n in
                                           (f.path.split("/")[1].removesuffix(".bin") for f in m.files
                                            if f.role == "tensor")}
        values["ids"] = tokenize(prompt, cfg)[None]
        if reference_bbox is not None:
            values["ref_bbox"] = torch.from_numpy(np.ascontiguousarray(reference_bbox, dtype=np.float32))
        if reference_image is not None:
            values["ref_image"] = torch.from_numpy(np.ascontiguousarray(reference_image, dtype=np.float32))
        for call in m.chain:
            if call.when == "request":
                self._call(call, values)
        values["x_rows"] = values["noise_rows"].clone()
        return values

    def step(self, values: dict[str, torch.Tensor], step: int,
             kv: Mapping[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]) -> None:
        sig = values["sigmas"]
        values["t"], values["dt"] = sig[step:step + 1].clone(), (sig[step + 1:step + 2] - sig[step:step + 1]).clone()
        for call in self.manifest.chain:
            if call.when != "step":
                continue
            if call.layers is not None:
                for layer in range(*call.layers):
                    k, v = kv[(step, layer)]
                    values[f"k{layer}"], values[f"v{layer}"] = k.float(), v.float()
            self._call(call, values)

    def finish(self, values: dict[str, torch.Tensor]) -> np.ndarray:
        for call in self.manifest.chain:
            if call.when == "finish":
                self._call(call, values)
        return values["image"].numpy()
