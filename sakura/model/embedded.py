"""The embedded models and model loading.

A model folder (ours, or any local diffusers-style folder) holds::

    sakura.json                  family + codec: {"family": "flux2"|"sd3", "resolution", "patch", "ref_size",
                                 "num_steps"} and, where not the default, "blank_tasks", "ref_mode",
                                 "locality", "patch_context" (``CodecConfig``)
    transformer/                 a diffusers transformer (config.json + diffusion_pytorch_model.safetensors)
    text_encoder/                ours: config.json + model.safetensors

The embedded models ship their weights under ``sakura/weights/<name>/`` in that same layout;
when the folder has no weights yet, the embedded model is built from its config with seeded
initialisation. Swapping weights is a file change only: nothing else depends on them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers import Flux2Transformer2DModel, SD3Transformer2DModel
from safetensors.torch import load_file, save_file

from sakura.model.base import CodecConfig, DiTAdapter
from sakura.model.flux2 import Flux2Adapter, flux2_in_channels
from sakura.model.sd3 import SD3Adapter
from sakura.model.text_encoder import TextEncoderConfig, TinyTextEncoder

WEIGHTS_DIR = Path(__file__).resolve().parent.parent / "weights"
EMBEDDED = ("sakura-tiny", "sakura-tiny-sd3")
DEFAULT_MODEL = "sakura-tiny"


class ModelLoadError(ValueError):
    """A model folder that is missing or incomplete; the message is one line and says what is missing."""


def embedded_codec(name: str) -> CodecConfig:
    """The codec a new run of an embedded model starts from (shipped weights carry theirs in sakura.json).
    sakura-tiny's is the shipped design (docs/results/issue28): references resized onto the mask and fed to
    the masked tokens, fill-style fs / vton, a per-head 2-D distance bias, no template pixels outside the mask
    in a masked token's patch."""
    if name == "sakura-tiny":
        return CodecConfig(resolution=256, patch=8, ref_size=128, num_steps=4, blank_tasks=("fs", "vton"),
                           ref_mode="aligned", locality=(0.0, 0.25, 0.5, 1.0), patch_context=False)
    return CodecConfig(resolution=256, patch=8, ref_size=64, num_steps=6 if name.endswith("sd3") else 4)


def embedded_transformer(name: str, seed: int = 0, codec: CodecConfig | None = None) -> torch.nn.Module:
    """The embedded configurations: small members of the real diffusers classes."""
    torch.manual_seed(seed)
    c = codec or embedded_codec(name)
    if name == "sakura-tiny":
        if c.locality and len(c.locality) != 4:
            raise ModelLoadError(f"sakura-tiny has 4 heads; the codec gives {len(c.locality)} locality slopes")
        return Flux2Transformer2DModel(
            patch_size=1, in_channels=flux2_in_channels(c.patch, c.ref_aligned), out_channels=c.patch_dim,
            num_layers=2, num_single_layers=6, attention_head_dim=64, num_attention_heads=4,
            joint_attention_dim=128, timestep_guidance_channels=256, mlp_ratio=3.0,
            axes_dims_rope=(16, 16, 16, 16), rope_theta=2000, guidance_embeds=False,
        )
    if name == "sakura-tiny-sd3":
        return SD3Transformer2DModel(
            sample_size=c.resolution, patch_size=c.patch, in_channels=7, num_layers=4,
            attention_head_dim=64, num_attention_heads=4, joint_attention_dim=128,
            caption_projection_dim=256, pooled_projection_dim=128, out_channels=3,
            pos_embed_max_size=c.grid, qk_norm="rms_norm",
        )
    raise ModelLoadError(f"unknown embedded model {name!r}; choose one of {', '.join(EMBEDDED)}")


def adapter_class(family: str):
    return {"flux2": Flux2Adapter, "sd3": SD3Adapter}[family]


def save_model(adapter: DiTAdapter, folder: str | Path) -> None:
    folder = Path(folder)
    c = adapter.codec
    (folder / "text_encoder").mkdir(parents=True, exist_ok=True)
    adapter.transformer.save_pretrained(folder / "transformer", safe_serialization=True)
    save_file(adapter.text_encoder.state_dict(), str(folder / "text_encoder" / "model.safetensors"))
    (folder / "text_encoder" / "config.json").write_text(json.dumps(adapter.text_encoder.config_dict()))
    meta = {"family": adapter.family, "model_id": adapter.model_id} | c.to_meta()
    (folder / "sakura.json").write_text(json.dumps(meta, indent=1))


def load_model_folder(folder: str | Path, dtype: torch.dtype = torch.float32) -> DiTAdapter:
    """Load real weights from a local folder (no download ever)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"model path {folder} does not exist or is not a folder")
    meta_path = folder / "sakura.json"
    if not meta_path.is_file():
        hint = (
            " (it looks like a diffusers pipeline: add a sakura.json codec file)"
            if (folder / "model_index.json").exists()
            else ""
        )
        raise ModelLoadError(f"model path {folder} has no sakura.json{hint}")
    for part, files in {"transformer": ("config.json",), "text_encoder": ("config.json", "model.safetensors")}.items():
        for f in files:
            if not (folder / part / f).is_file():
                raise ModelLoadError(f"model path {folder} is incomplete: missing {part}/{f}")
    if not any((folder / "transformer").glob("*.safetensors")):
        raise ModelLoadError(f"model path {folder} is incomplete: no transformer/*.safetensors weights")
    meta = json.loads(meta_path.read_text())
    family = meta.get("family")
    if family not in ("flux2", "sd3"):
        raise ModelLoadError(f"model path {folder}: sakura.json family must be flux2 or sd3, got {family!r}")
    cls = Flux2Transformer2DModel if family == "flux2" else SD3Transformer2DModel
    try:
        transformer = cls.from_pretrained(folder / "transformer", torch_dtype=dtype, local_files_only=True)
    except Exception as e:  # diffusers raises many kinds; one clear line for the user
        raise ModelLoadError(f"model path {folder}: cannot load transformer ({type(e).__name__}: {e})") from e
    text_cfg = TextEncoderConfig(**json.loads((folder / "text_encoder" / "config.json").read_text()))
    text_encoder = TinyTextEncoder(text_cfg)
    text_encoder.load_state_dict(load_file(str(folder / "text_encoder" / "model.safetensors")))
    try:
        codec = CodecConfig.from_meta(meta)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"model path {folder}: bad codec in sakura.json ({type(e).__name__}: {e})") from e
    return adapter_class(family)(transformer, text_encoder.to(dtype), codec, meta.get("model_id", folder.name))


def load_model(name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype = torch.float32) -> DiTAdapter:
    """An embedded model by name (shipped weights, else seeded) or a local model folder by path."""
    name = str(name_or_path)
    if name in EMBEDDED:
        folder = WEIGHTS_DIR / name
        if (folder / "sakura.json").is_file():
            return load_model_folder(folder, dtype)
        return seeded_model(name, dtype)
    return load_model_folder(name, dtype)


def seeded_model(name: str = DEFAULT_MODEL, dtype: torch.dtype = torch.float32, seed: int = 0,
                 codec: CodecConfig | None = None) -> DiTAdapter:
    codec = codec or embedded_codec(name)
    transformer = embedded_transformer(name, seed, codec)
    torch.manual_seed(seed + 1)
    family = "sd3" if name.endswith("sd3") else "flux2"
    # Flux2 has no pooled-text input: the instruction joins its time embedding (Flux2Adapter.set_instruction)
    text_encoder = TinyTextEncoder(TextEncoderConfig(instruction_dim=transformer.inner_dim if family == "flux2" else 0))
    return adapter_class(family)(transformer.to(dtype), text_encoder.to(dtype), codec, name)
