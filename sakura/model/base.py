"""What every DiT adapter shares: the edit request, pixel-space tokens, the flow-matching loop,
and the attention-processor seam for capture / masked runs / attention probes.

The edit is masked inpainting by flow matching. The unmasked tokens follow the *template's*
trajectory ``x_t = (1-t)·x0 + t·ε`` with a template-fixed noise ε (blended in before every
step), so their inputs are the same for every request: that is what makes their K/V reusable
across requests. A masked run computes only the masked tokens (+ text / reference tokens) and
gets the reusable tokens' K/V from a *provider* callback ``provider(step, layer) -> (K, V)``,
each ``(n, heads*head_dim)``: the seam the streaming runtime plugs into.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from sakura.kvcache import KVCache
from sakura.model.pixels import (  # noqa: F401
    mask_bbox_crop,
    patchify,
    place_in_bbox,
    resize_image,
    template_condition,
    unpatchify,
)

Provider = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


class ModelInputError(ValueError):
    """A request the model cannot run (wrong mask shape, empty prompt, …); the message is one line."""


class LocalSwitch(Exception):
    """Raised by a provider when the reusable K/V it was asked for will not come in time: the masked
    run then computes the current step again, and every later one, on every token (no cache needed).
    The step's partial masked work is dropped; the token state at the step's start is intact."""


@dataclass
class EditRequest:
    """One edit, as the device sees it. Images are float32 HxWx3 in [0, 1]; mask is bool HxW."""

    template: np.ndarray
    mask: np.ndarray
    task: str = "mb"
    prompt: str = ""
    reference: np.ndarray | None = None
    seed: int = 0  # template noise seed: must match the seed the cache was captured with


@dataclass
class EditResult:
    image: np.ndarray  # float32 HxWx3 in [0, 1]
    seconds: float = 0.0
    cache: KVCache | None = None
    importance: dict[tuple[int, int], torch.Tensor] | None = None  # probe: (step, layer) -> (n,)
    extras: dict = field(default_factory=dict)


@dataclass
class CodecConfig:
    """How pixels become tokens for a pixel-space model (the embedded models)."""

    resolution: int = 256
    patch: int = 8
    ref_size: int = 64  # reference crops are resized to this (ref_size/patch)² tokens
    num_steps: int = 4
    # Tasks whose template pixels under the mask are hidden from the model (fill-style, like
    # FLUX.1 Fill): the edit must then take its context from the reusable tokens around the mask.
    blank_tasks: tuple[str, ...] = ()
    # How a reference (fs / vton) enters: "tokens" (its own tokens, as FLUX.2 adds reference images),
    # "aligned" (resized onto the mask's bounding box as an extra feature of the masked tokens, as
    # try-on and face-swap pipelines warp the reference before generating) or "both".
    ref_mode: str = "tokens"
    # Per-head slopes of a distance bias between image tokens (-slope · grid distance on the attention
    # logits, ALiBi in 2-D); empty: none. A locality prior: DiTs mix space through attention.
    locality: tuple[float, ...] = ()
    # False: a masked token does not see the template's pixels of its patch outside the mask either;
    # what surrounds the mask then reaches it only through attention (the cache).
    patch_context: bool = True

    @property
    def ref_tokens(self) -> bool:
        return self.ref_mode in ("tokens", "both")

    @property
    def ref_aligned(self) -> bool:
        return self.ref_mode in ("aligned", "both")

    def to_meta(self) -> dict:
        """The codec as stored in a model folder's ``sakura.json`` (defaults left out)."""
        meta = {"resolution": self.resolution, "patch": self.patch, "ref_size": self.ref_size,
                "num_steps": self.num_steps}
        if self.blank_tasks:
            meta["blank_tasks"] = list(self.blank_tasks)
        if self.ref_mode != "tokens":
            meta["ref_mode"] = self.ref_mode
        if self.locality:
            meta["locality"] = list(self.locality)
        if not self.patch_context:
            meta["patch_context"] = False
        return meta

    @classmethod
    def from_meta(cls, meta: dict) -> "CodecConfig":
        mode = meta.get("ref_mode", "tokens")
        if mode not in ("tokens", "aligned", "both"):
            raise ValueError(f"ref_mode must be tokens, aligned or both, got {mode!r}")
        return cls(int(meta["resolution"]), int(meta["patch"]), int(meta.get("ref_size", 64)),
                   int(meta["num_steps"]), tuple(meta.get("blank_tasks", ())), mode,
                   tuple(float(x) for x in meta.get("locality", ())), bool(meta.get("patch_context", True)))

    @property
    def grid(self) -> int:
        return self.resolution // self.patch

    @property
    def num_tokens(self) -> int:
        return self.grid**2

    @property
    def patch_dim(self) -> int:
        return self.patch * self.patch * 3


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, explicit: bool = False,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, S, D) attention, with an optional additive logit ``bias`` (1, H, S_q, S_k). ``explicit``
    writes softmax(QKᵀ)V out, which exports/delegates cleanly."""
    if bias is not None:
        bias = bias.to(q.dtype)
    if not explicit:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    logits = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(logits if bias is None else logits + bias, dim=-1) @ v


def distance_bias(slopes: tuple[float, ...], grid: int, query_tokens: list, key_tokens: list) -> torch.Tensor:
    """The locality prior: (1, H, S_q, S_k) logits bias ``-slope_h · |pos_i − pos_j|`` between image
    tokens (grid distance), 0 where either side is not an image token. ``query_tokens`` /
    ``key_tokens`` list the sequence in pieces: an int (that many non-image tokens) or a tensor of
    image-token ids (row-major on the ``grid``)."""

    def positions(parts) -> torch.Tensor:
        pos = []
        for part in parts:
            if isinstance(part, int):
                pos.append(torch.full((part, 2), float("nan")))
            else:
                ids = part.long()
                pos.append(torch.stack([ids // grid, ids % grid], 1).float())
        return torch.cat(pos, 0)

    pq, pk = positions(query_tokens), positions(key_tokens)
    dist = torch.cdist(pq.nan_to_num(0.0), pk.nan_to_num(0.0))
    image_pair = ~(pq[:, :1].isnan() | pk[:, :1].isnan().T)
    dist = torch.where(image_pair, dist, torch.zeros(()))
    slope = torch.tensor(slopes, dtype=torch.float32)[:, None, None]
    return (-slope * dist)[None]


def probe_scores(q_masked: torch.Tensor, k_all: torch.Tensor, n_reuse: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """Σ over heads and masked queries of the squared attention probability on the LAST ``n_reuse``
    keys. q (B, H, M, D), k (B, H, S, D), bias (1, H, M, S) → (n_reuse,). One head at a time: never
    the full matrix."""
    scale = q_masked.shape[-1] ** -0.5
    out = torch.zeros(n_reuse, dtype=torch.float32, device=q_masked.device)
    if n_reuse == 0 or q_masked.shape[2] == 0:
        return out
    for h in range(q_masked.shape[1]):
        logits = (q_masked[:, h].float() @ k_all[:, h].float().transpose(-1, -2)) * scale
        if bias is not None:
            logits = logits + bias[:, h].float()
        p = torch.softmax(logits, dim=-1)
        out += p[..., -n_reuse:].square().sum(dim=(0, 1))
    return out


class RunContext:
    """Mutable state shared by the processors of one adapter during a run."""

    def __init__(self) -> None:
        self.mode = "off"  # off | capture | masked
        self.step = 0
        self.explicit = False
        self.reuse_index: torch.Tensor | None = None  # image-token indices of reusable tokens
        self.provider: Provider | None = None
        self.captured: KVCache | None = None
        self.probe: dict[tuple[int, int], torch.Tensor] | None = None
        self.num_masked = 0  # masked image queries in the current (masked) sequence
        self.layer_times: list[tuple[int, int, float]] = []  # (step, layer, t) when K/V were asked for
        self.local_from: int | None = None  # the step a masked run switched to every token at (LocalSwitch)
        self.steps: int | None = None  # run only the first steps (None: all)
        # start at this step from this state, recorded by a run whose steps before it were the same (None: at 0)
        self.resume: tuple[int, torch.Tensor] | None = None
        self.trajectory: dict[int, torch.Tensor] | None = None  # (when given) records the state each step starts from
        # image-token ids of the sequence's image part, in sequence order (for the locality bias)
        self.image_rows: torch.Tensor | None = None
        self.bias_cache: dict = {}

    def set_image_rows(self, rows: torch.Tensor | None) -> None:
        self.image_rows, self.bias_cache = rows, {}


class DiTAdapter(ABC):
    """Masked execution with template KV reuse on an unmodified diffusers transformer."""

    family: str = ""

    def __init__(self, transformer: torch.nn.Module, text_encoder: torch.nn.Module, codec: CodecConfig,
                 model_id: str = "custom"):
        self.transformer = transformer.eval()
        self.text_encoder = text_encoder.eval()
        self.codec = codec
        self.model_id = model_id
        self.ctx = RunContext()
        self._original_processors: dict | None = None

    # -- geometry -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def attention_modules(self) -> list[torch.nn.Module]:
        """The attention sites in execution order; a site's index is its cache *layer*."""

    @property
    def num_layers(self) -> int:
        return len(self.attention_modules)

    @property
    def num_steps(self) -> int:
        return self.codec.num_steps

    @property
    def heads(self) -> int:
        return self.transformer.config.num_attention_heads  # both diffusers families name it so

    @property
    def head_dim(self) -> int:
        return self.transformer.config.attention_head_dim

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def sigmas(self) -> torch.Tensor:
        return torch.linspace(1.0, 0.0, self.num_steps + 1)

    # -- hooks ----------------------------------------------------------------------------------
    @property
    def needs_processors(self) -> bool:
        """True when the model's own attention differs from the stock processors' (a locality bias):
        every run, training included, then goes through ours."""
        return bool(self.codec.locality)

    @abstractmethod
    def _make_processor(self, layer: int, module: torch.nn.Module): ...

    def attach(self) -> None:
        """Install our processors (kept until ``detach``); the model's weights are untouched."""
        if self._original_processors is not None:
            return
        self._original_processors = {}
        for layer, module in enumerate(self.attention_modules):
            self._original_processors[layer] = module.processor
            module.set_processor(self._make_processor(layer, module))

    def detach(self) -> None:
        if self._original_processors is None:
            return
        for layer, module in enumerate(self.attention_modules):
            module.set_processor(self._original_processors[layer])
        self._original_processors = None

    @contextmanager
    def _run(self, mode: str, **state):
        self.attach()
        ctx = self.ctx
        ctx.mode, ctx.step = mode, 0
        ctx.provider = state.get("provider")
        ctx.reuse_index = state.get("reuse_index")
        ctx.probe = {} if state.get("probe") else None
        ctx.explicit = state.get("explicit", False)
        ctx.layer_times, ctx.local_from, ctx.steps = [], None, state.get("steps")
        ctx.resume, ctx.trajectory = state.get("resume"), state.get("trajectory")
        ctx.set_image_rows(None)
        try:
            yield ctx
        finally:
            ctx.mode, ctx.provider = "off", None

    # -- request → tensors ----------------------------------------------------------------------
    def validate(self, req: EditRequest) -> None:
        r = self.codec.resolution
        if req.template.shape != (r, r, 3):
            raise ModelInputError(f"template must be {r}x{r}x3, got {tuple(req.template.shape)}")
        if req.mask.shape != (r, r):
            raise ModelInputError(f"mask must be {r}x{r} to match the template, got {tuple(req.mask.shape)}")
        if not req.mask.any():
            raise ModelInputError("mask is empty: nothing to edit")
        if req.task == "mb" and not req.prompt.strip():
            raise ModelInputError("a text edit (mb) needs a non-empty prompt")
        if req.task in ("fs", "vton") and req.reference is None:
            raise ModelInputError(f"task {req.task} needs a reference image")

    def token_mask(self, mask: np.ndarray) -> torch.Tensor:
        p = self.codec.patch
        m = torch.from_numpy(np.ascontiguousarray(mask)).float().unsqueeze(-1)
        return patchify(m, p).amax(dim=1) > 0

    def template_tokens(self, req: EditRequest) -> tuple[torch.Tensor, torch.Tensor]:
        """Clean template tokens x0 in [-1, 1] and the template-fixed noise ε, both (N, patch_dim)."""
        x0 = patchify(torch.from_numpy(req.template).float() * 2 - 1, self.codec.patch)
        g = torch.Generator().manual_seed(req.seed)
        return x0, torch.randn(x0.shape, generator=g)

    def conditioning_tokens(self, req: EditRequest, x0: torch.Tensor) -> torch.Tensor:
        """What the model sees of the template: ``x0``, with the masked pixels blanked for the
        codec's fill-style tasks and, without ``codec.patch_context``, the context pixels of masked
        tokens hidden too (:func:`template_condition`)."""
        blank = req.task in self.codec.blank_tasks
        if not blank and self.codec.patch_context:
            return x0
        m = torch.from_numpy(np.ascontiguousarray(req.mask, dtype=np.float32))[..., None]
        return template_condition(x0, patchify(m, self.codec.patch), blank, self.codec.patch_context)

    def reference_tokens(self, req: EditRequest) -> torch.Tensor | None:
        if req.task not in ("fs", "vton") or req.reference is None or not self.codec.ref_tokens:
            return None
        ref = resize_image(req.reference, self.codec.ref_size)
        return patchify(torch.from_numpy(ref).float() * 2 - 1, self.codec.patch)

    def aligned_reference(self, req: EditRequest) -> torch.Tensor | None:
        """The reference resized onto the mask's bounding box, in [-1, 1] inside the mask and 0
        elsewhere, as (N, patch_dim) tokens; None unless the codec aligns references."""
        if req.task not in ("fs", "vton") or req.reference is None or not self.codec.ref_aligned:
            return None
        r = self.codec.resolution
        canvas = place_in_bbox(np.zeros((r, r, 3), np.float32), req.mask, req.reference) * 2 - 1
        canvas = np.where(req.mask[..., None], canvas, 0.0).astype(np.float32)
        return patchify(torch.from_numpy(canvas), self.codec.patch)

    def self_conditioned(self, req: EditRequest) -> EditRequest:
        """The request that captures a template's cache: its own masked content / an empty edit."""
        ref = mask_bbox_crop(req.template, req.mask) if req.task in ("fs", "vton") else None
        return EditRequest(req.template, req.mask, req.task, prompt="keep", reference=ref, seed=req.seed)

    # -- the denoising loop ---------------------------------------------------------------------
    @abstractmethod
    def _velocity(self, x: torch.Tensor, x0: torch.Tensor, tmask: torch.Tensor, t: float,
                  text: tuple[torch.Tensor, torch.Tensor], ref: torch.Tensor | None,
                  rows: torch.Tensor | None) -> torch.Tensor:
        """Velocity for image tokens ``rows`` (all tokens when None) given the full token state x;
        ``x0`` is the template conditioning (masked pixels blanked for ``codec.blank_tasks``)."""

    def _sample(self, req: EditRequest, rows: torch.Tensor | None) -> np.ndarray:
        self.validate(req)
        x0, noise = self.template_tokens(req)
        tmask = self.token_mask(req.mask)
        text = self.text_encoder.encode(req.prompt or "")
        ref = self.reference_tokens(req)
        sig = self.sigmas()
        cond = self.conditioning_tokens(req, x0)
        first, x = self.ctx.resume if self.ctx.resume is not None else (0, noise)
        x = x.clone()
        for i in range(first, self.num_steps if self.ctx.steps is None else min(self.ctx.steps, self.num_steps)):
            t, t_next = float(sig[i]), float(sig[i + 1])
            self.ctx.step = i
            if self.ctx.trajectory is not None:
                self.ctx.trajectory[i] = x.clone()
            # unmasked tokens always sit on the template's own trajectory (request independent)
            x = torch.where(tmask[:, None], x, (1 - t) * x0 + t * noise)
            try:
                v = self._velocity(x, cond, tmask, t, text, ref, rows)
            except LocalSwitch:
                rows, self.ctx.mode, self.ctx.local_from = None, "off", i
                v = self._velocity(x, cond, tmask, t, text, ref, rows)
            if rows is None:
                x = x + (t_next - t) * v
            else:
                x[rows] = x[rows] + (t_next - t) * v
        r = self.codec.resolution
        img = unpatchify((x.clamp(-1, 1) + 1) / 2, self.codec.patch, r, r).numpy()
        m = req.mask[..., None]
        return np.where(m, img, req.template).astype(np.float32)

    @torch.no_grad()
    def full_edit(self, req: EditRequest, capture: bool = False, steps: int | None = None) -> EditResult:
        """Every token, every step (the `local` baseline); optionally capture the reusable K/V (of the
        first ``steps`` steps only: the image is then not finished)."""
        self.validate(req)
        start = time.perf_counter()
        reuse = torch.nonzero(~self.token_mask(req.mask)).flatten()
        if capture:
            with self._run("capture", reuse_index=reuse, steps=steps) as ctx:
                ctx.captured = KVCache(self.num_steps, self.num_layers, self.heads, self.head_dim, reuse)
                img = self._sample(req, rows=None)
                cache = ctx.captured
        elif self.needs_processors:
            with self._run("off", steps=steps):
                img = self._sample(req, rows=None)
            cache = None
        else:
            self.detach()
            img = self._sample(req, rows=None)
            cache = None
        return EditResult(img, time.perf_counter() - start, cache=cache)

    @torch.no_grad()
    def capture(self, req: EditRequest, steps: int | None = None) -> KVCache:
        """The template's FP32 cache, captured under its own conditioning (cast to FP16 to store/send)."""
        return self.full_edit(self.self_conditioned(req), capture=True, steps=steps).cache

    @torch.no_grad()
    def recompute_first_step(self, req: EditRequest) -> dict:
        """The template's reusable K/V of step 0, computed on the device: at step 0 every token is the
        template's fixed noise, so the state is request-independent and needs only the template image,
        its mask and seed (which the device has). One full forward; the same K/V the stored cache holds.
        Safe to call from inside a running masked edit's provider (the run's state is put back)."""
        with self._nested():
            cache = self.capture(req, steps=1)
        return {key: (cache.k[key], cache.v[key]) for key in cache.k}

    @contextmanager
    def _nested(self):
        """Run the model from inside a run (a provider callback): snapshot and restore the run's state."""
        ctx = self.ctx
        saved = dict(vars(ctx))
        per_request = {a: getattr(self, a) for a in ("_num_txt", "_mask_feat", "_aligned", "_mask_px")
                       if hasattr(self, a)}
        try:
            yield
        finally:
            vars(ctx).update(saved)
            for a, v in per_request.items():
                setattr(self, a, v)

    @torch.no_grad()
    def masked_edit(self, req: EditRequest, provider: Provider, probe: bool = False, explicit: bool = False,
                    resume: tuple[int, torch.Tensor] | None = None,
                    trajectory: dict[int, torch.Tensor] | None = None) -> EditResult:
        """Compute only masked tokens; reusable K/V come from ``provider(step, layer)``. A provider that
        raises :class:`LocalSwitch` turns the rest of the run into a full one (the local fallback).
        ``trajectory``: a dict to record the state each step starts from; ``resume=(step, state)``: start there
        from a state so recorded, by a run of the same request whose provider gave the same K/V before ``step``
        (the steps before it would only recompute it)."""
        self.validate(req)
        start = time.perf_counter()
        tmask = self.token_mask(req.mask)
        rows = torch.nonzero(tmask).flatten()
        reuse = torch.nonzero(~tmask).flatten()
        with self._run("masked", provider=provider, reuse_index=reuse, probe=probe, explicit=explicit, resume=resume,
                       trajectory=trajectory) as ctx:
            ctx.num_masked = int(rows.numel())
            img = self._sample(req, rows=rows)
            importance, local_from = ctx.probe, ctx.local_from
            times = list(ctx.layer_times)
        end = time.perf_counter()
        return EditResult(img, end - start, importance=importance,
                          extras={"layer_times": times, "t0": start, "t1": end, "local_from": local_from})

    # -- helpers for processors -------------------------------------------------------------------
    def _reused_kv(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V from the provider as (1, H, n, D) in the dtype of ``like``."""
        ctx = self.ctx
        ctx.layer_times.append((ctx.step, layer, time.perf_counter()))
        k, v = ctx.provider(ctx.step, layer)
        n = k.shape[0]
        shape = (1, n, self.heads, self.head_dim)
        return (k.to(like.dtype).reshape(shape).transpose(1, 2), v.to(like.dtype).reshape(shape).transpose(1, 2))

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store (1, H, n, D) reusable K/V of the current step (capture mode)."""
        ctx = self.ctx
        flat = lambda t: t[0].transpose(0, 1).reshape(t.shape[2], self.heads * self.head_dim).clone()  # noqa: E731
        ctx.captured.k[(ctx.step, layer)] = flat(k)
        ctx.captured.v[(ctx.step, layer)] = flat(v)

    def _joint_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         reuse_pos: torch.Tensor | None, masked_pos: slice | None,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of the run's own tokens, (B, H, S, D), dispatching on the run mode.

        capture: store K/V at ``reuse_pos``; masked: append the provider's K/V as extra keys and
        optionally probe the squared attention the masked queries (``masked_pos``) give them.
        ``bias`` (1, H, S, S_keys) covers every key, the appended ones included."""
        ctx = self.ctx
        if ctx.mode == "capture" and reuse_pos is not None:
            self._store(layer, k[:, :, reuse_pos], v[:, :, reuse_pos])
        elif ctx.mode == "masked":
            rk, rv = self._reused_kv(layer, k)
            k, v = torch.cat([k, rk], dim=2), torch.cat([v, rv], dim=2)
            if ctx.probe is not None and masked_pos is not None:
                qb = None if bias is None else bias[:, :, masked_pos]
                ctx.probe[(ctx.step, layer)] = probe_scores(q[:, :, masked_pos], k, rk.shape[2], qb)
        return attention(q, k, v, explicit=ctx.explicit, bias=bias)
