"""Adapter for diffusers' ``Flux2Transformer2DModel`` (FLUX.2-klein's transformer class).

Sequence order inside attention is [text, image, reference]; layout (B, S, H, D) before our
transpose. Image tokens carry [noisy patch, template patch, mask patch] features (a fill-style
input); reference tokens carry [reference patch, 0, 0] and sit at RoPE time-offset 10 like
FLUX.2's reference images. Masked runs feed the stock forward only the masked image tokens
(with their own position ids) — every token-wise op then runs on those tokens only — and our
processors append the reusable tokens' K/V to the keys.
"""

from __future__ import annotations

import torch
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux2 import (
    Flux2Attention,
    Flux2ParallelSelfAttention,
    Flux2Transformer2DModel,
)

from sakura.model.base import DiTAdapter, distance_bias, patchify

REF_TIME_OFFSET = 10


class Flux2DoubleProcessor:
    """Flux2AttnProcessor with our attention (capture / masked reuse / probe)."""

    def __init__(self, adapter: "Flux2Adapter", layer: int):
        self.adapter, self.layer = adapter, layer

    def __call__(self, attn: Flux2Attention, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        def heads(t):
            return t.unflatten(-1, (-1, attn.head_dim))

        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        q, k = attn.norm_q(q), attn.norm_k(k)
        eq = attn.norm_added_q(heads(attn.add_q_proj(encoder_hidden_states)))
        ek = attn.norm_added_k(heads(attn.add_k_proj(encoder_hidden_states)))
        ev = heads(attn.add_v_proj(encoder_hidden_states))
        q, k, v = torch.cat([eq, q], 1), torch.cat([ek, k], 1), torch.cat([ev, v], 1)
        q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
        k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        out = self.adapter._attend_joint(self.layer, q, k, v)
        txt_len = encoder_hidden_states.shape[1]
        enc, img = out[:, :txt_len], out[:, txt_len:]
        return attn.to_out[1](attn.to_out[0](img)), attn.to_add_out(enc)


class Flux2SingleProcessor:
    """Flux2ParallelSelfAttnProcessor with our attention."""

    def __init__(self, adapter: "Flux2Adapter", layer: int):
        self.adapter, self.layer = adapter, layer

    def __call__(self, attn: Flux2ParallelSelfAttention, hidden_states, attention_mask=None,
                 image_rotary_emb=None):
        h = attn.to_qkv_mlp_proj(hidden_states)
        qkv, mlp = torch.split(h, [3 * attn.inner_dim, h.shape[-1] - 3 * attn.inner_dim], dim=-1)
        q, k, v = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        q, k = attn.norm_q(q), attn.norm_k(k)
        q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
        k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        out = self.adapter._attend_joint(self.layer, q, k, v)
        return attn.to_out(torch.cat([out, attn.mlp_act_fn(mlp)], dim=-1))


def _add_instruction(module, args, output):
    """A forward hook on ``time_guidance_embed``: its output plus the instruction's embedding (our text
    encoder's pooled projection, set per request), so a text edit's words reach every token's modulation as
    FLUX.1's pooled CLIP vector does — a masked token needs no attention to the text to know "red"."""
    extra = getattr(module, "sakura_instruction", None)
    return output if extra is None else output + extra.to(output.dtype)


class Flux2Adapter(DiTAdapter):
    family = "flux2"

    def __init__(self, transformer, text_encoder, codec, model_id: str = "custom"):
        super().__init__(transformer, text_encoder, codec, model_id)
        embed = transformer.time_guidance_embed
        hooked = _add_instruction in embed._forward_hooks.values()  # (one transformer may get several adapters)
        if getattr(text_encoder, "instruction_proj", None) is not None and not hooked:
            embed.register_forward_hook(_add_instruction)

    def set_instruction(self, pooled: torch.Tensor | None, transformer=None) -> None:
        """The instruction every following forward of ``transformer`` (default: ours) adds to its time
        embedding: (B, dim) pooled text, or None to clear it."""
        instruction = None if pooled is None else self.text_encoder.instruction(pooled)
        (transformer or self.transformer).time_guidance_embed.sakura_instruction = instruction

    @property
    def attention_modules(self):
        t = self.transformer
        return [b.attn for b in t.transformer_blocks] + [b.attn for b in t.single_transformer_blocks]

    def _make_processor(self, layer, module):
        cls = Flux2DoubleProcessor if isinstance(module, Flux2Attention) else Flux2SingleProcessor
        return cls(self, layer)

    def _attend_joint(self, layer: int, q, k, v) -> torch.Tensor:
        """q/k/v (B, S, H, D) in [text, image, ref] order → attention output (B, S, H*D)."""
        L = self._num_txt
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        reuse_pos = None if self.ctx.reuse_index is None else self.ctx.reuse_index + L
        masked = slice(L, L + self.ctx.num_masked)
        out = self._joint_attention(layer, q, k, v, reuse_pos, masked, self._locality_bias(q.shape[2]))
        return out.transpose(1, 2).flatten(2, 3).to(q.dtype)

    def _locality_bias(self, seq_len: int) -> torch.Tensor | None:
        """The codec's distance bias for a [text, image, ref] sequence (+ the reusable keys a masked
        run appends); computed once per forward shape."""
        c, ctx = self.codec, self.ctx
        if not c.locality:
            return None
        rows = ctx.image_rows
        if rows is None:
            raise RuntimeError("locality bias needs the sequence's image-token ids (ctx.set_image_rows)")
        appended = ctx.mode == "masked"
        key = (seq_len, appended)
        if key not in ctx.bias_cache:
            L = self._num_txt
            parts = [L, rows, seq_len - L - len(rows)]
            ctx.bias_cache[key] = distance_bias(c.locality, c.grid, parts,
                                                parts + ([ctx.reuse_index] if appended else []))
        return ctx.bias_cache[key]

    # -- inputs ---------------------------------------------------------------------------------
    def _ids(self, rows: torch.Tensor, ref_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.codec.grid
        hw = torch.stack([rows // g, rows % g], dim=1)
        img = torch.cat(
            [torch.zeros(len(rows), 1, dtype=torch.long), hw, torch.zeros(len(rows), 1, dtype=torch.long)], 1
        )
        if ref_tokens:
            rg = int(round(ref_tokens**0.5))
            r = torch.arange(ref_tokens)
            ref = torch.stack([torch.full_like(r, REF_TIME_OFFSET), r // rg, r % rg, torch.zeros_like(r)], 1)
            img = torch.cat([img, ref], 0)
        return img, None

    def image_features(self, x: torch.Tensor, cond: torch.Tensor, mask_px: torch.Tensor,
                       aligned: torch.Tensor | None) -> torch.Tensor:
        """Per image token: [noisy patch, template patch (blanked for fill-style tasks), mask patch,
        aligned reference patch (codecs that align references; zeros without a reference)]. Any
        leading dims; the one layout training, masked runs and shard executors all use."""
        parts = [x, cond, mask_px]
        if self.codec.ref_aligned:
            parts.append(torch.zeros_like(x) if aligned is None else aligned)
        return torch.cat(parts, dim=-1)

    def reference_features(self, ref: torch.Tensor, width: int) -> torch.Tensor:
        """Reference tokens padded to the image tokens' feature width: [reference patch, 0, …]."""
        return torch.cat([ref, ref.new_zeros(*ref.shape[:-1], width - ref.shape[-1])], -1)

    def _velocity(self, x, x0, tmask, t, text, ref, rows):
        n = x.shape[0]
        rows = torch.arange(n) if rows is None else rows
        pp = self.codec.patch**2
        mask_feat = tmask.float()[:, None].expand(n, pp) if self._mask_feat is None else self._mask_feat
        aligned = None if self._aligned is None else self._aligned[rows]
        feats = self.image_features(x[rows], x0[rows], mask_feat[rows], aligned)
        nref = 0 if ref is None else ref.shape[0]
        if nref:
            feats = torch.cat([feats, self.reference_features(ref, feats.shape[1])], 0)
        img_ids, _ = self._ids(rows, nref)
        tokens, pooled = text
        self.set_instruction(pooled)
        L = tokens.shape[1]
        self._num_txt = L
        self.ctx.set_image_rows(rows)
        txt_ids = torch.zeros(L, 4, dtype=torch.long)
        txt_ids[:, 3] = torch.arange(L)
        dt = self.dtype
        out = self.transformer(hidden_states=feats[None].to(dt), encoder_hidden_states=tokens.to(dt),
                               timestep=torch.tensor([t], dtype=dt), img_ids=img_ids, txt_ids=txt_ids,
                               guidance=None, return_dict=False)[0]
        return out[0, : len(rows)].float()

    _mask_feat = None  # pixel-exact mask features, set per request in _sample
    _aligned = None  # the aligned reference's tokens, set per request in _sample
    _num_txt = 0

    def _sample(self, req, rows):
        m = torch.from_numpy(req.mask.astype("float32"))[..., None]
        self._mask_feat = patchify(m, self.codec.patch)
        self._aligned = self.aligned_reference(req)
        try:
            return super()._sample(req, rows)
        finally:
            self._mask_feat = self._aligned = None


QK_NORMS = ("norm_q", "norm_k", "norm_added_q", "norm_added_k")


@torch.no_grad()
def sharpen(adapter: Flux2Adapter, scale: float) -> int:
    """Multiply every attention logit by ``scale`` (a temperature change): every q/k RMSNorm weight of the
    Flux2 attention sites × √scale, in place. Returns how many norms were scaled."""
    alpha, n = scale**0.5, 0
    for module in adapter.attention_modules:
        for name in QK_NORMS:
            norm = getattr(module, name, None)
            if norm is not None and getattr(norm, "weight", None) is not None:
                norm.weight.mul_(alpha)
                n += 1
    return n


def flux2_in_channels(patch: int, ref_aligned: bool = False) -> int:
    """[noisy patch, template patch, mask patch (, aligned reference patch)] per token."""
    return (3 if ref_aligned else 2) * patch * patch * 3 + patch * patch


def is_flux2(model: torch.nn.Module) -> bool:
    return isinstance(model, Flux2Transformer2DModel)
