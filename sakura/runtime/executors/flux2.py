"""Shard-level masked runs of diffusers' ``Flux2Transformer2DModel`` (the sakura-tiny family).

Replicates ``Flux2Transformer2DModel.forward`` in pieces, with the model's own submodules:

* ``begin_step``: the features of the masked (+ reference) tokens (``Flux2Adapter.image_features``) → ``x_embedder``;
  ``time_guidance_embed`` → the three modulations. Computed once per request: ``context_embedder``
  of the (fixed-length) text states and the RoPE tables of [text, masked image, reference] ids.
* ``run_shard``: :class:`Flux2Shard` — blocks ``[l0, l1)`` (double blocks on separate text / image
  streams, single blocks on the joint stream), attention through the adapter's processors in
  masked mode with the shard's reusable K/V as inputs. Outputs ``(img, txt)``.
* ``end_step``: ``norm_out`` / ``proj_out`` on the image stream, velocity of the masked rows,
  flow-matching update. Exactly the arithmetic of ``DiTAdapter._sample`` / ``Flux2Adapter._velocity``.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from sakura.model.base import DiTAdapter, patchify, unpatchify
from sakura.runtime.executors.base import ShardExecutionError, ShardRun, ShardSignature


def input_names(num_double: int, l0: int, l1: int) -> list[str]:
    """Positional input names of the shard ``[l0, l1)`` of a model with ``num_double`` double blocks."""
    return (["img", "txt"] + (["mod_img", "mod_txt"] if l0 < num_double else [])
            + (["mod_single"] if l1 > num_double else []) + ["cos", "sin"]
            + [f"{kind}{layer}" for layer in range(l0, l1) for kind in ("k", "v")])


class Flux2Shard(nn.Module):
    """Blocks ``[l0, l1)`` of a Flux2 transformer as one graph.

    Inputs (positional, names in :attr:`input_names`): ``img (1, S_img, D)``, ``txt (1, L, D)``,
    the modulations the shard's block kinds need (``mod_img``, ``mod_txt`` for double blocks,
    ``mod_single`` for single blocks, each ``(1, k·D)``), ``cos``, ``sin`` ``(L+S_img, head_dim)``,
    then ``k_l, v_l`` ``(n, heads·head_dim)`` for every layer. Outputs ``(img, txt)``.
    The adapter's processors must be in masked mode (:meth:`Flux2Run.masked_context`)."""

    def __init__(self, adapter: DiTAdapter, l0: int, l1: int, num_txt: int):
        super().__init__()
        t = adapter.transformer
        self.adapter = [adapter]  # a list: keep the adapter out of the module tree
        self.l0, self.l1, self.num_txt = l0, l1, num_txt
        self.num_double = len(t.transformer_blocks)
        blocks = list(t.transformer_blocks) + list(t.single_transformer_blocks)
        self.blocks = nn.ModuleList(blocks[l0:l1])
        self.has_double = l0 < self.num_double
        self.has_single = l1 > self.num_double
        self.input_names = input_names(self.num_double, l0, l1)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = dict(zip(self.input_names, inputs))
        kv = inputs[len(self.input_names) - 2 * (self.l1 - self.l0):]
        l0 = self.l0
        ctx = self.adapter[0].ctx
        ctx.provider = lambda step, layer: (kv[2 * (layer - l0)], kv[2 * (layer - l0) + 1])
        rope = (x["cos"], x["sin"])
        img, txt, joint = x["img"], x["txt"], None
        L = self.num_txt
        for i, block in enumerate(self.blocks):
            layer = l0 + i
            if layer < self.num_double:
                txt, img = block(hidden_states=img, encoder_hidden_states=txt, temb_mod_img=x["mod_img"],
                                 temb_mod_txt=x["mod_txt"], image_rotary_emb=rope)
            else:
                if joint is None:
                    joint = torch.cat([txt, img], dim=1)
                joint = block(hidden_states=joint, encoder_hidden_states=None, temb_mod=x["mod_single"],
                              image_rotary_emb=rope)
        if joint is not None:
            txt, img = joint[:, :L], joint[:, L:]
        return img, txt


class Flux2Run(ShardRun):
    def _setup(self) -> None:
        a, req = self.adapter, self.req
        t = a.transformer
        self.dt = a.dtype
        self.x0, self.noise = a.template_tokens(req)
        self.tmask = a.token_mask(req.mask)
        self.rows = torch.nonzero(self.tmask).flatten()
        self.reuse = torch.nonzero(~self.tmask).flatten()
        tokens, pooled = a.text_encoder.encode(req.prompt or "")
        a.set_instruction(pooled)  # (time_guidance_embed's hook adds it in _pre)
        ref = a.reference_tokens(req)
        self.num_txt = tokens.shape[1]
        m = torch.from_numpy(req.mask.astype("float32"))[..., None]
        mask_feat = patchify(m, a.codec.patch)  # pixel-exact mask features (as Flux2Adapter._sample)
        self.mask_rows = mask_feat[self.rows]
        self.cond_rows = a.conditioning_tokens(req, self.x0)[self.rows]
        aligned = a.aligned_reference(req)
        self.aligned_rows = None if aligned is None else aligned[self.rows]
        self.nref = 0 if ref is None else ref.shape[0]
        width = a.image_features(self.x0[:1], self.x0[:1], mask_feat[:1], None).shape[1]
        self.ref_feats = None if ref is None else a.reference_features(ref, width)
        with torch.no_grad():
            self.txt0 = t.context_embedder(tokens.to(self.dt))
            img_ids, _ = a._ids(self.rows, self.nref)
            txt_ids = torch.zeros(self.num_txt, 4, dtype=torch.long)
            txt_ids[:, 3] = torch.arange(self.num_txt)
            ic, is_ = t.pos_embed(img_ids)
            tc, ts = t.pos_embed(txt_ids)
            self.cos, self.sin = torch.cat([tc, ic], 0), torch.cat([ts, is_], 0)
        self.sig = a.sigmas()
        self.x = self.noise.clone()
        self.stream: dict[str, torch.Tensor] = {}

    def signature(self, l0: int, l1: int) -> ShardSignature:
        a = self.adapter
        return ShardSignature("flux2", a.model_id, int(self.rows.numel()) + self.nref, self.num_txt,
                              int(self.reuse.numel()), a.heads, a.head_dim, l0, l1,
                              str(self.dt).removeprefix("torch."))

    def graph_constants(self) -> str:
        codec = self.adapter.codec
        if not codec.locality:
            return ""
        where = hashlib.sha1(self.rows.numpy().tobytes() + self.reuse.numpy().tobytes()).hexdigest()[:16]
        return json.dumps({"locality": list(codec.locality), "grid": codec.grid, "tokens": where})

    def shard_module(self, l0: int, l1: int) -> Flux2Shard:
        return Flux2Shard(self.adapter, l0, l1, self.num_txt)

    def input_names(self, l0: int, l1: int) -> list[str]:
        return input_names(len(self.adapter.transformer.transformer_blocks), l0, l1)

    @contextmanager
    def masked_context(self, explicit: bool):
        a = self.adapter
        with a._run("masked", reuse_index=self.reuse, explicit=explicit) as ctx:
            ctx.num_masked = int(self.rows.numel())
            ctx.set_image_rows(self.rows)
            a._num_txt = self.num_txt
            yield ctx

    @torch.no_grad()
    def _pre(self, step: int) -> None:
        t = self.adapter.transformer
        ts = float(self.sig[step])
        self.x = torch.where(self.tmask[:, None], self.x, (1 - ts) * self.x0 + ts * self.noise)
        feats = self.adapter.image_features(self.x[self.rows], self.cond_rows, self.mask_rows, self.aligned_rows)
        if self.ref_feats is not None:
            feats = torch.cat([feats, self.ref_feats], 0)
        timestep = torch.tensor([ts], dtype=self.dt).to(self.dt) * 1000
        temb = t.time_guidance_embed(timestep, None)
        self.stream = {
            "img": t.x_embedder(feats[None].to(self.dt)), "txt": self.txt0, "temb": temb,
            "mod_img": t.double_stream_modulation_img(temb), "mod_txt": t.double_stream_modulation_txt(temb),
            "mod_single": t.single_stream_modulation(temb), "cos": self.cos, "sin": self.sin,
        }

    def _stream_inputs(self, l0: int, l1: int) -> list[torch.Tensor]:
        names = self.input_names(l0, l1)
        return [self.stream[n] for n in names[: len(names) - 2 * (l1 - l0)]]

    def _take_outputs(self, outputs) -> None:
        self.stream["img"], self.stream["txt"] = outputs[0], outputs[1]

    @torch.no_grad()
    def _post(self, step: int) -> None:
        t = self.adapter.transformer
        h = t.norm_out(self.stream["img"], self.stream["temb"])
        v = t.proj_out(h)[0, : len(self.rows)].float()
        ts, tn = float(self.sig[step]), float(self.sig[step + 1])
        self.x[self.rows] = self.x[self.rows] + (tn - ts) * v

    def _image(self) -> np.ndarray:
        a, req = self.adapter, self.req
        r = a.codec.resolution
        img = unpatchify((self.x.clamp(-1, 1) + 1) / 2, a.codec.patch, r, r).numpy()
        return np.where(req.mask[..., None], img, req.template).astype(np.float32)


def run_class_for(adapter: DiTAdapter) -> type[ShardRun]:
    if adapter.family == "flux2":
        return Flux2Run
    raise ShardExecutionError(f"shard-level execution supports Flux2 models; {adapter.model_id!r} is "
                              f"{adapter.family or type(adapter).__name__} (use adapter.masked_edit)")
