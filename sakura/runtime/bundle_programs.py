"""The torch modules a phone bundle exports as ExecuTorch programs (:mod:`sakura.runtime.bundle`): the per-request
setup, each step's start and end, and the image. The cache shards are :mod:`sakura.runtime.backends`' programs."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sakura.model.base import DiTAdapter, attention, patchify, unpatchify
from sakura.model.pixels import mask_bbox
from sakura.model.text_encoder import PAD, TinyTextEncoder


class TextEncoderProgram(nn.Module):
    """The text encoder (``TinyTextEncoder.forward``) with its attention written out as softmax(QKᵀ)V:
    token ids (1, L) int64 → token states (1, L, dim), pooled vector (1, pooled)."""

    def __init__(self, enc: TinyTextEncoder):
        super().__init__()
        self.enc = enc

    def _attend(self, mha: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
        b, n, e = x.shape
        h = mha.num_heads
        q, k, v = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, h, e // h).transpose(1, 2) for t in (q, k, v))
        out = attention(q, k, v, explicit=True).transpose(1, 2).reshape(b, n, e)
        return mha.out_proj(out)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.enc
        words = enc.embed(ids)
        x = words + enc.pos[: ids.shape[1]]
        for layer in enc.encoder.layers:
            x = x + self._attend(layer.self_attn, layer.norm1(x))
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
        h = enc.norm(x)
        keep = (ids != PAD).unsqueeze(-1).to(h.dtype)
        count = keep.sum(1).clamp(min=1)
        pooled = (h * keep).sum(1) / count
        if enc.instruction_proj is not None:
            pooled = torch.cat([pooled, (words * keep).sum(1) / count], -1)
        return h, pooled


class TextConditioning(nn.Module):
    """The transformer's text inputs: ``context_embedder`` of the token states and the instruction (the pooled
    vector's projection, added to the time embedding every step)."""

    def __init__(self, adapter: DiTAdapter):
        super().__init__()
        self.context_embedder = adapter.transformer.context_embedder
        self.instruction_proj = adapter.text_encoder.instruction_proj

    def forward(self, tokens: torch.Tensor, pooled: torch.Tensor):
        txt = self.context_embedder(tokens)
        if self.instruction_proj is None:
            return (txt,)
        return txt, self.instruction_proj(pooled)


class AlignedReference(nn.Module):
    """The user's reference, already resized to the mask's bounding box (``ref_bbox`` (h, w, 3) in [0, 1]), placed
    on the template canvas, kept inside the mask and cut into the masked rows' tokens (``aligned_rows``)."""

    def __init__(self, mask: np.ndarray, rows: torch.Tensor, patch: int):
        super().__init__()
        r = mask.shape[0]
        self.box = mask_bbox(mask)
        self.r, self.patch = r, patch
        self.register_buffer("mask", torch.from_numpy(mask.astype(np.float32))[..., None])
        self.register_buffer("rows", rows.clone())

    def forward(self, ref_bbox: torch.Tensor) -> torch.Tensor:
        y0, x0, y1, x1 = self.box
        canvas = F.pad((ref_bbox * 2 - 1).permute(2, 0, 1), (x0, self.r - x1, y0, self.r - y1)).permute(1, 2, 0)
        return patchify(canvas * self.mask, self.patch).index_select(0, self.rows)


class ReferenceTokens(nn.Module):
    """A reference of its own tokens (codecs with ``ref_mode`` tokens): (ref_size, ref_size, 3) in [0, 1] →
    its tokens padded to the image tokens' feature width."""

    def __init__(self, patch: int, width: int):
        super().__init__()
        self.patch, self.width = patch, width

    def forward(self, ref: torch.Tensor) -> torch.Tensor:
        tokens = patchify(ref * 2 - 1, self.patch)
        return torch.cat([tokens, tokens.new_zeros(tokens.shape[0], self.width - tokens.shape[1])], -1)


class StepPre(nn.Module):
    """``Flux2Run.begin_step`` on the masked rows: image features → ``x_embedder``; the time embedding (+ the
    instruction) → the three modulations. ``t`` (1,) is the step's sigma."""

    def __init__(self, adapter: DiTAdapter, aligned: bool, ref_tokens: bool, instruction: bool):
        super().__init__()
        t = adapter.transformer
        self.adapter = [adapter]  # out of the module tree: its image_features is plain arithmetic
        self.x_embedder, self.time_guidance_embed = t.x_embedder, t.time_guidance_embed
        self.mod_img, self.mod_txt = t.double_stream_modulation_img, t.double_stream_modulation_txt
        self.mod_single = t.single_stream_modulation
        self.aligned, self.ref_tokens, self.instruction = aligned, ref_tokens, instruction
        self.input_names = (["x_rows", "cond_rows", "mask_rows"] + (["aligned_rows"] if aligned else [])
                            + (["ref_feats"] if ref_tokens else []) + ["t"] + (["instruction"] if instruction else []))

    def forward(self, *inputs: torch.Tensor):
        x = dict(zip(self.input_names, inputs))
        # (a codec that aligns references and a request without one: image_features fills zeros)
        feats = self.adapter[0].image_features(x["x_rows"], x["cond_rows"], x["mask_rows"], x.get("aligned_rows"))
        if self.ref_tokens:
            feats = torch.cat([feats, x["ref_feats"]], 0)
        temb = self.time_guidance_embed(x["t"] * 1000, None)
        if self.instruction:
            temb = temb + x["instruction"]
        return self.x_embedder(feats[None]), temb, self.mod_img(temb), self.mod_txt(temb), self.mod_single(temb)


class StepPost(nn.Module):
    """``Flux2Run.end_step``: output norm and projection on the image stream, the masked rows' velocity and the
    flow-matching update ``x_rows + dt · v`` (``dt`` (1,) = next sigma − this sigma)."""

    def __init__(self, adapter: DiTAdapter, num_rows: int):
        super().__init__()
        t = adapter.transformer
        self.norm_out, self.proj_out, self.num_rows = t.norm_out, t.proj_out, num_rows

    def forward(self, img: torch.Tensor, temb: torch.Tensor, x_rows: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        v = self.proj_out(self.norm_out(img, temb))[0, : self.num_rows].float()
        return x_rows + dt * v


class Finish(nn.Module):
    """The edited image: the masked rows' pixels inside the mask, the template everywhere else ((H, W, 3) in [0, 1])."""

    def __init__(self, rows: torch.Tensor, patch: int, resolution: int):
        super().__init__()
        self.register_buffer("rows", rows.clone())
        self.patch, self.r = patch, resolution

    def forward(self, x_rows: torch.Tensor, template: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tokens = patchify(template, self.patch).index_copy(0, self.rows, (x_rows.clamp(-1, 1) + 1) / 2)
        img = unpatchify(tokens, self.patch, self.r, self.r)
        return torch.where(mask > 0.5, img, template)


@contextmanager
def bare_time_embedding(adapter: DiTAdapter):
    """The time embedding without the per-request instruction hook's addend (the programs take it as an input)."""
    embed = adapter.transformer.time_guidance_embed
    saved = getattr(embed, "sakura_instruction", None)
    embed.sakura_instruction = None
    try:
        yield
    finally:
        embed.sakura_instruction = saved
