"""Sharpen a Flux2 model's attention without changing its architecture.

    python -m sakura.model.sharpen --scale 4 --out /tmp/sharp-4 [--model sakura-tiny] [--ckpt runs/sharp-4]

Flux2 RMS-normalises q and k per head with learnable weights (``norm_q`` / ``norm_k`` in every
block, ``norm_added_q`` / ``norm_added_k`` for the text stream of the double blocks). Multiplying
all of them by √scale multiplies every attention logit by ``scale`` — a temperature change. The
classes, the K/V cache layout and every processor stay as they are; only the weights differ.

Writes a model folder (the ``--ship`` format) and, with ``--ckpt``, a step-0 training checkpoint
(raw = EMA = sharpened weights, fresh optimiser) to warm-start ``python -m sakura.model.train
--resume --out <ckpt>`` from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from sakura.model.embedded import load_model, save_model
from sakura.model.flux2 import sharpen
from sakura.model.train import Trainer


def step0_checkpoint(adapter, model: str, out: Path) -> Path:
    """A training checkpoint at step 0 holding ``adapter``'s weights as raw and EMA weights."""
    tr = Trainer(model, out, device=torch.device("cpu"), codec=adapter.codec)
    tr.transformer.load_state_dict(adapter.transformer.state_dict())
    tr.text_encoder.load_state_dict(adapter.text_encoder.state_dict())
    tr.ema_tr.load_state_dict(adapter.transformer.state_dict())
    tr.ema_te.load_state_dict(adapter.text_encoder.state_dict())
    return tr.save()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.model.sharpen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="sakura-tiny", help="embedded model name or model folder to start from")
    ap.add_argument("--scale", type=float, required=True, help="factor on every attention logit (α²)")
    ap.add_argument("--out", required=True, help="model folder to write")
    ap.add_argument("--ckpt", default=None, help="also write a step-0 training checkpoint into this run folder")
    args = ap.parse_args(argv)
    adapter = load_model(args.model)
    if adapter.family != "flux2":
        raise SystemExit("sharpen scales Flux2's q/k norms; this model is " + adapter.family)
    n = sharpen(adapter, args.scale)
    save_model(adapter, args.out)
    print(f"scaled {n} q/k norms by √{args.scale:g} → {args.out}")
    if args.ckpt:
        print(f"step-0 checkpoint → {step0_checkpoint(adapter, adapter.model_id, Path(args.ckpt))}")


if __name__ == "__main__":
    main()
