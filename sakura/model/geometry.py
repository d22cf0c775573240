"""Named transformer geometries: time a real model's blocks at its size, without its weights.

A *geometry model* is a seeded random-weight member of the real diffusers class with a named model's
per-block dimensions (heads, head dim, MLP ratio, RoPE axes) and image-token count (our pixel codec
at the resolution and patch that give that model's latent grid), but only the blocks asked for and
the project's own tiny text encoder (16 text tokens of width 128; the real model's text encoder and
its longer prompts are not modelled). Its weights are random, so it measures *times* — rebuild vs
execute per shard — never quality::

    >>> adapter = geometry_model("flux2-klein-4b", layers=(1, 3))   # 1 double + 3 single blocks
    >>> adapter.heads * adapter.head_dim, adapter.codec.num_tokens
    (3072, 1024)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from diffusers import Flux2Transformer2DModel

from sakura.model.base import CodecConfig
from sakura.model.embedded import ModelLoadError
from sakura.model.flux2 import Flux2Adapter, flux2_in_channels
from sakura.model.text_encoder import TinyTextEncoder

RANDOM_WEIGHTS_NOTE = "random weights: times only"


@dataclass(frozen=True)
class Flux2Geometry:
    """Per-block dimensions of a ``Flux2Transformer2DModel`` and the codec that gives its token count."""

    name: str
    title: str  # the model it is the geometry of, as people write it
    heads: int
    head_dim: int
    mlp_ratio: float
    axes_dims_rope: tuple[int, ...]  # sums to head_dim
    num_double: int  # the real model's blocks (a geometry model usually takes fewer)
    num_single: int
    codec: CodecConfig
    rope_theta: int = 2000
    timestep_guidance_channels: int = 256
    source: str = ""

    @property
    def d(self) -> int:
        return self.heads * self.head_dim

    @property
    def num_layers(self) -> int:
        return self.num_double + self.num_single


# FLUX.2-klein-4B's transformer (diffusers config: 24 × 128 heads, mlp_ratio 3, RoPE axes 4 × 32,
# theta 2000, 5 double + 20 single blocks; 4 steps). Its VAE latent grid at 512² is 32 × 32 = 1024
# image tokens; our pixel codec gets the same grid from 512² at patch 16, and a 128² reference crop
# (8 × 8 tokens) keeps the reference at the tiny model's share of the image (64² of 256²).
GEOMETRIES: dict[str, Flux2Geometry] = {
    g.name: g for g in (
        Flux2Geometry("flux2-klein-4b", "FLUX.2-klein-4B", heads=24, head_dim=128, mlp_ratio=3.0,
                      axes_dims_rope=(32, 32, 32, 32), num_double=5, num_single=20,
                      codec=CodecConfig(resolution=512, patch=16, ref_size=128, num_steps=4),
                      source="black-forest-labs/FLUX.2-klein-4B transformer/config.json"),
    )
}


def get_geometry(geometry: str | Flux2Geometry) -> Flux2Geometry:
    if isinstance(geometry, Flux2Geometry):
        return geometry
    try:
        return GEOMETRIES[geometry]
    except KeyError:
        raise ModelLoadError(f"unknown geometry {geometry!r}; choose one of {', '.join(GEOMETRIES)}") from None


def parse_layers(spec: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"D,S"`` (double, single blocks) → ``(D, S)``; None stays None (the geometry's own counts)."""
    if spec is None or isinstance(spec, tuple):
        return spec
    parts = [p.strip() for p in str(spec).split(",")]
    try:
        double, single = (int(p) for p in parts)
    except ValueError:
        raise ModelLoadError(f"layers {spec!r}: expected D,S (double, single block counts), e.g. 1,3") from None
    return double, single


def geometry_model(geometry: str | Flux2Geometry, layers: tuple[int, int] | str | None = None, *, seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> Flux2Adapter:
    """A seeded random-weight adapter of ``geometry`` with ``layers = (double, single)`` blocks."""
    g = get_geometry(geometry)
    double, single = parse_layers(layers) or (g.num_double, g.num_single)
    if double < 0 or single < 0 or double + single < 1:
        raise ModelLoadError(f"layers ({double}, {single}): need at least one block and no negative count")
    if sum(g.axes_dims_rope) != g.head_dim:
        raise ModelLoadError(f"geometry {g.name}: RoPE axes {g.axes_dims_rope} must sum to head_dim {g.head_dim}")
    text_encoder_seed, c = seed + 1, g.codec
    torch.manual_seed(seed)
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=flux2_in_channels(c.patch), out_channels=c.patch_dim,
        num_layers=double, num_single_layers=single, attention_head_dim=g.head_dim, num_attention_heads=g.heads,
        joint_attention_dim=TinyTextEncoder().cfg.dim, timestep_guidance_channels=g.timestep_guidance_channels,
        mlp_ratio=g.mlp_ratio, axes_dims_rope=g.axes_dims_rope, rope_theta=g.rope_theta, guidance_embeds=False,
    )
    torch.manual_seed(text_encoder_seed)
    text_encoder = TinyTextEncoder()
    return Flux2Adapter(transformer.to(dtype), text_encoder.to(dtype), c, f"{g.name}-d{double}s{single}-random")


def geometry_record(adapter, g: Flux2Geometry | None = None) -> dict:
    """What a report says about the model a timing ran on (the geometry's name, its dims, how many of
    the real model's blocks, the weights)."""
    t = adapter.transformer
    rec = {"d": adapter.heads * adapter.head_dim, "heads": adapter.heads, "head_dim": adapter.head_dim,
           "layers": adapter.num_layers, "steps": adapter.num_steps, "image_tokens": adapter.codec.num_tokens,
           "resolution": adapter.codec.resolution, "patch": adapter.codec.patch,
           "transformer_params": sum(p.numel() for p in t.parameters())}
    if hasattr(t, "transformer_blocks"):
        rec["double_blocks"], rec["single_blocks"] = len(t.transformer_blocks), len(t.single_transformer_blocks)
        rec["mlp_ratio"] = t.config.mlp_ratio
    if g is not None:
        te = adapter.text_encoder.cfg
        rec.update({"of": g.title, "geometry": g.name, "model_blocks": [g.num_double, g.num_single],
                    "weights": f"seeded random ({RANDOM_WEIGHTS_NOTE})",
                    "text_encoder": f"sakura tiny ({te.max_tokens} tokens × {te.dim})", "source": g.source})
    return rec
