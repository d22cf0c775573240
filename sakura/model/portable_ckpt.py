"""A compact resumable training checkpoint, small enough to commit while a long run is under way.

``ckpt.pt`` (the run folder's checkpoint) holds everything in fp32: weights, EMA weights and both
AdamW moments, five copies of the model. The portable file keeps what a resumed run needs at the
precision it needs:

* raw weights in fp16 (the shipped weights are fp16 too); EMA weights as their difference from the
  raw ones, int8 per block of 256 with an fp32 scale per block (the two stay close, so the
  difference's rounding is far below fp16's on the weights themselves);
* AdamW's second moment as √v, int8 per block of 256 with an fp32 scale per block (Adam divides by
  √v, so its relative precision is what matters, and √v spans a far smaller range than v);
* not the first moment: with β1 = 0.9 it is re-estimated within a few tens of steps (a resumed run
  starts it at zero, which only damps the first updates);
* step, elapsed time, loss history and the run's config (codec included) as metadata.

One safetensors file; a run writes it next to ``ckpt.pt`` at every save when ``--portable PATH`` is
given and resumes from it when its run folder has no ``ckpt.pt``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BLOCK = 256


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Blockwise absmax int8: (blocks, BLOCK) int8 and one fp32 scale per block."""
    r = x.float().flatten()
    pad = (-r.numel()) % BLOCK
    blocks = torch.cat([r, r.new_zeros(pad)]).view(-1, BLOCK)
    scale = blocks.abs().amax(1).clamp(min=1e-30) / 127.0
    return torch.round(blocks / scale[:, None]).to(torch.int8), scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (q.float() * scale[:, None]).flatten()[: like.numel()].view_as(like)


def save_portable(trainer, path: str | Path) -> Path:
    path = Path(path)
    tensors: dict[str, torch.Tensor] = {}
    for part, raw, ema in (("transformer", trainer.transformer, trainer.ema_tr),
                           ("text_encoder", trainer.text_encoder, trainer.ema_te)):
        ema_state = None if ema is None else ema.state_dict()
        for name, value in raw.state_dict().items():
            tensors[f"raw.{part}.{name}"] = value.detach().to("cpu", torch.float16).contiguous()
            if ema_state is not None:
                q, scale = _quantize(ema_state[name].cpu().float() - value.cpu().float())
                tensors[f"emad.{part}.{name}"], tensors[f"emas.{part}.{name}"] = q, scale
    state = trainer.opt.state_dict()["state"]
    for idx, st in state.items():
        q, scale = _quantize(st["exp_avg_sq"].cpu().float().clamp(min=0).sqrt())
        tensors[f"v.{idx}"], tensors[f"vscale.{idx}"] = q.contiguous(), scale.contiguous()
    steps = {str(i): float(st["step"]) for i, st in state.items()}
    history = torch.tensor(trainer.history, dtype=torch.float64).reshape(-1, 3)
    tensors["history"] = history.contiguous()
    meta = {"model": trainer.model_name, "step": str(trainer.step), "elapsed": repr(trainer.elapsed),
            "config": json.dumps(trainer.config()), "adam_steps": json.dumps(steps)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def portable_config(path: str | Path) -> dict:
    """The run config a portable checkpoint was written with (codec included), without loading it."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    return {"model": meta["model"], "config": json.loads(meta["config"])}


def load_portable(trainer, path: str | Path) -> None:
    """Put a portable checkpoint's state into ``trainer`` (built with the checkpoint's codec). Resuming
    from an unquantised state with ``exp_avg`` cleared, as here, is what the file stands for."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    if meta["model"] != trainer.model_name:
        raise ValueError(f"portable checkpoint is for {meta['model']}, not {trainer.model_name}")
    t = load_file(str(path))
    for part, raw, ema in (("transformer", trainer.transformer, trainer.ema_tr),
                           ("text_encoder", trainer.text_encoder, trainer.ema_te)):
        own = raw.state_dict()
        weights = {name: t[f"raw.{part}.{name}"].to(own[name].dtype) for name in own}
        raw.load_state_dict(weights)
        if ema is not None:
            ema.load_state_dict({name: w + _dequantize(t[f"emad.{part}.{name}"], t[f"emas.{part}.{name}"],
                                                       w).to(w.dtype) for name, w in weights.items()})
    params = [p for g in trainer.opt.param_groups for p in g["params"]]
    steps = json.loads(meta["adam_steps"])
    state = {}
    for idx, p in enumerate(params):
        if f"v.{idx}" not in t:
            continue
        root = _dequantize(t[f"v.{idx}"], t[f"vscale.{idx}"], p.detach())
        state[idx] = {"step": torch.tensor(steps[str(idx)]), "exp_avg": torch.zeros_like(p),
                      "exp_avg_sq": root.square().to(p.dtype)}
    sd = trainer.opt.state_dict()
    sd["state"] = state
    trainer.opt.load_state_dict(sd)
    trainer.step, trainer.elapsed = int(meta["step"]), float(meta["elapsed"])
    trainer.history = [(int(s), float(e), float(loss)) for s, e, loss in t["history"].tolist()]
