"""Adapter for diffusers' ``SD3Transformer2DModel`` (SD3.5's transformer class).

Sequence order inside joint attention is [image, text]; layout (B, H, S, D); no RoPE (absolute
sin-cos positions are added in ``pos_embed``). The forward takes a spatial tensor, so a masked
run keeps the stock forward and attaches two forward hooks: one on ``pos_embed`` that keeps only
the masked tokens (after their positions were added), one on ``proj_out`` that scatters them back
into a full token grid for the stock unpatchify. SD3.5's dual-attention layers (``attn2``,
image-only self-attention) are extra attention sites with caches of their own.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention

from sakura.model.base import DiTAdapter, ModelInputError, patchify, unpatchify


class SD3JointProcessor:
    def __init__(self, adapter: "SD3Adapter", layer: int):
        self.adapter, self.layer = adapter, layer

    def __call__(self, attn: Attention, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 *args, **kwargs):
        b = hidden_states.shape[0]

        def heads(t):
            return t.view(b, -1, attn.heads, t.shape[-1] // attn.heads).transpose(1, 2)

        q, k, v = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states)), heads(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q = attn.norm_q(q)
        if attn.norm_k is not None:
            k = attn.norm_k(k)
        n_img = hidden_states.shape[1]
        if encoder_hidden_states is not None:
            eq = heads(attn.add_q_proj(encoder_hidden_states))
            ek = heads(attn.add_k_proj(encoder_hidden_states))
            ev = heads(attn.add_v_proj(encoder_hidden_states))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            q, k, v = torch.cat([q, eq], 2), torch.cat([k, ek], 2), torch.cat([v, ev], 2)
        ctx = self.adapter.ctx
        masked = slice(0, ctx.num_masked)
        out = self.adapter._joint_attention(self.layer, q, k, v, ctx.reuse_index, masked)
        out = out.transpose(1, 2).reshape(b, -1, attn.heads * q.shape[-1]).to(q.dtype)
        img, enc = out[:, :n_img], out[:, n_img:]
        img = attn.to_out[1](attn.to_out[0](img))
        if encoder_hidden_states is None:
            return img
        if not attn.context_pre_only:
            enc = attn.to_add_out(enc)
        return img, enc


class SD3Adapter(DiTAdapter):
    family = "sd3"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.codec.locality:
            raise ModelInputError("the locality bias is implemented for the Flux2 family only")

    @property
    def attention_modules(self):
        mods = []
        for block in self.transformer.transformer_blocks:
            mods.append(block.attn)
            if getattr(block, "attn2", None) is not None:
                mods.append(block.attn2)
        return mods

    def sigmas(self) -> torch.Tensor:
        return torch.linspace(1.0, 0.0, self.num_steps + 1)

    def _make_processor(self, layer, module):
        return SD3JointProcessor(self, layer)

    def validate(self, req):
        if req.task != "mb":
            raise ModelInputError(f"the SD3-class model edits by text only (task mb), not {req.task}")
        super().validate(req)

    def _velocity(self, x, x0, tmask, t, text, ref, rows):
        r, p = self.codec.resolution, self.codec.patch
        mask_px = self._mask_px
        spatial = torch.cat([unpatchify(x, p, r, r), unpatchify(x0, p, r, r), mask_px], dim=-1)
        spatial = spatial.permute(2, 0, 1)[None].to(self.dtype)
        tokens, pooled = text
        hooks = []
        if rows is not None:
            n = self.codec.num_tokens
            hooks.append(self.transformer.pos_embed.register_forward_hook(lambda m, i, o: o[:, rows]))

            def scatter(m, i, o):
                full = o.new_zeros(o.shape[0], n, o.shape[-1])
                full[:, rows] = o
                return full

            hooks.append(self.transformer.proj_out.register_forward_hook(scatter))
        try:
            out = self.transformer(hidden_states=spatial, encoder_hidden_states=tokens.to(self.dtype),
                                   pooled_projections=pooled.to(self.dtype),
                                   timestep=torch.tensor([t * 1000.0], dtype=self.dtype), return_dict=False)[0]
        finally:
            for h in hooks:
                h.remove()
        v = patchify(out[0].permute(1, 2, 0).float(), p)
        return v if rows is None else v[rows]

    _mask_px = None

    def _sample(self, req, rows):
        self._mask_px = torch.from_numpy(req.mask.astype("float32"))[..., None] * 2 - 1
        try:
            return super()._sample(req, rows)
        finally:
            self._mask_px = None
