"""Train the embedded models on synthetic edit tasks (flow matching, masked-token loss).

    python -m sakura.model.train --model sakura-tiny --out runs/tiny --minutes 65 [--resume]
    python -m sakura.model.train --model sakura-tiny --out runs/tiny --ship   # EMA weights → sakura/weights

The formulation is exactly the sampler's (``sakura.model.base``): x_t = (1-t)·x0 + t·ε, target
velocity v = ε − x0 (x0 = the *edited* image, equal to the template outside the mask), the
template image and mask as extra input features. The loss is on masked tokens with a small
weight elsewhere. Times t are half from the 4-step sampler's grid {1, .75, .5, .25} (6-step grid
for SD3) and half logit-normal.

To fit a 2-core CPU, a batch sees a *window* of the 32×32 token grid that holds every sample's
mask with context (tokens keep their real positions: RoPE ids for Flux2, the matching crop of
the absolute position embedding for SD3); a fraction of batches use the whole grid. The same
script runs on a GPU (device auto-detected).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import signal
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from sakura.model.base import CodecConfig, EditRequest, patchify, template_condition, unpatchify
from sakura.model.edit_data import EDIT_OPS, TASKS, EditExample, EditSynth, heldout_examples
from sakura.model.embedded import (
    WEIGHTS_DIR,
    adapter_class,
    embedded_codec,
    load_model_folder,
    save_model,
    seeded_model,
)
from sakura.model.flux2 import sharpen
from sakura.model.portable_ckpt import load_portable, portable_config, save_portable
from sakura.model.sample_grid import render_grid
from sakura.model.text_encoder import tokenize

UNMASKED_WEIGHT = 0.05
TASK_PROBS = {"sakura-tiny": {"fs": 0.33, "vton": 0.27, "mb": 0.40}, "sakura-tiny-sd3": {"mb": 1.0}}
WINDOW_MIN = {"fs": 16, "vton": 20, "mb": 18}  # tokens per side that always hold the task's mask


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Trainer:
    def __init__(self, model: str = "sakura-tiny", out: str | Path = "runs/tiny", batch: int = 4,
                 lr: float = 3e-4, schedule: str = "cosine", ema: float = 0.999, seed: int = 0,
                 t_sampling: str = "mixed", full_prob: float = 0.03, device: torch.device | None = None,
                 warmup: int = 50, codec: CodecConfig | None = None, task_mix: dict[str, float] | None = None,
                 mb_op_mix: dict[str, float] | None = None, text_lr_mult: float = 1.0):
        self.model_name, self.out = model, Path(out)
        self.task_mix = dict(task_mix or TASK_PROBS[model])
        self.batch, self.lr, self.schedule, self.ema_decay = batch, lr, schedule, ema
        self.seed, self.t_sampling, self.full_prob, self.warmup = seed, t_sampling, full_prob, warmup
        self.device = device or default_device()
        self.adapter = seeded_model(model, codec=codec)  # the codec fixes the input width: set it here
        self.adapter.detach()
        self.sd3 = self.adapter.family == "sd3"
        self.codec = self.adapter.codec
        self.transformer = self.adapter.transformer.to(self.device).train()
        self.text_encoder = self.adapter.text_encoder.to(self.device).train()
        # no weight decay on gains and biases: decay would pull the q/k norm gains, i.e. the attention
        # temperature, toward zero; the text encoder may learn faster (its rare words see few updates)
        self.text_lr_mult = text_lr_mult
        groups = []
        for module, mult in ((self.transformer, 1.0), (self.text_encoder, text_lr_mult)):
            params = list(module.parameters())
            groups += [{"params": [p for p in params if p.ndim >= 2], "lr_mult": mult},
                       {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr_mult": mult}]
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
        self.ema_tr = copy.deepcopy(self.transformer).eval().requires_grad_(False) if ema > 0 else None
        self.ema_te = copy.deepcopy(self.text_encoder).eval().requires_grad_(False) if ema > 0 else None
        if self.adapter.needs_processors:  # the model's attention is ours (locality bias), in training too
            self.adapter.attach()
        self.mb_op_mix = dict(mb_op_mix or {})
        self.synth = EditSynth("train", mb_op_weights=self.mb_op_mix)
        self.step, self.elapsed = 0, 0.0
        self.history: list[tuple[int, float, float]] = []  # (step, seconds, loss)
        self.t_grid = torch.linspace(1.0, 0.0, self.codec.num_steps + 1)[:-1]

    # ------------------------------------------------------------------ data
    def _window(self, rng: np.random.Generator, task: str) -> tuple[int, int, int]:
        g = self.codec.grid
        if rng.random() < self.full_prob:
            return 0, 0, g
        side = WINDOW_MIN[task] if rng.random() < 0.8 else int(rng.integers(WINDOW_MIN[task], g + 1))
        side = min(side, g)
        return int(rng.integers(0, g - side + 1)), int(rng.integers(0, g - side + 1)), side

    def make_batch(self, step: int) -> dict:
        rng = np.random.default_rng([self.seed, step])
        probs = self.task_mix
        task = str(rng.choice(list(probs), p=list(probs.values())))
        ty, tx, side = self._window(rng, task)
        p = self.codec.patch
        region = (ty * p, tx * p, (ty + side) * p, (tx + side) * p)
        examples = [self.synth.sample(rng, task, region=region) for _ in range(self.batch)]
        return self.tensors(examples, (ty, tx, side), rng)

    def tensors(self, examples: list[EditExample], window: tuple[int, int, int], rng: np.random.Generator,
                t: torch.Tensor | None = None) -> dict:
        p = self.codec.patch
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).float()  # noqa: E731
        x0 = torch.stack([patchify(to(e.template) * 2 - 1, p) for e in examples])
        tgt = torch.stack([patchify(to(e.target) * 2 - 1, p) for e in examples])
        mpx = torch.stack([patchify(to(e.mask)[..., None], p) for e in examples])
        tmask = mpx.amax(-1) > 0
        # what the model is conditioned on (DiTAdapter.conditioning_tokens)
        x0 = template_condition(x0, mpx, examples[0].task in self.codec.blank_tasks, self.codec.patch_context)
        text = torch.stack([tokenize(e.prompt, self.text_encoder.cfg) for e in examples])
        reqs = [EditRequest(e.template, e.mask, e.task, e.prompt, e.reference) for e in examples]
        ref = aligned = None
        if examples[0].task in ("fs", "vton") and not self.sd3:
            if self.codec.ref_tokens:
                ref = torch.stack([self.adapter.reference_tokens(r) for r in reqs])
            if self.codec.ref_aligned:
                aligned = torch.stack([self.adapter.aligned_reference(r) for r in reqs])
        if t is None:
            t = self.sample_t(len(examples), rng)
        g = torch.Generator().manual_seed(int(rng.integers(0, 2**31)))
        eps = torch.randn(x0.shape, generator=g)
        return {"x0": x0, "tgt": tgt, "mpx": mpx, "tmask": tmask, "text": text, "ref": ref, "aligned": aligned,
                "t": t, "eps": eps, "window": window}

    def sample_t(self, n: int, rng: np.random.Generator) -> torch.Tensor:
        u = torch.from_numpy(rng.random(n)).float()
        logit = torch.sigmoid(torch.from_numpy(rng.standard_normal(n)).float())
        grid = self.t_grid[torch.from_numpy(rng.integers(0, len(self.t_grid), n))]
        if self.t_sampling == "uniform":
            return u
        if self.t_sampling == "logit":
            return logit
        return torch.where(torch.from_numpy(rng.random(n) < 0.5), grid, logit)

    # ------------------------------------------------------------------ model
    def predict(self, b: dict, transformer=None, text_encoder=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(prediction, target velocity, weights) on the window's image tokens."""
        tr = transformer or self.transformer
        te = text_encoder or self.text_encoder
        d = self.device
        x0, tgt, eps, t = b["x0"].to(d), b["tgt"].to(d), b["eps"].to(d), b["t"].to(d)
        xt = (1 - t)[:, None, None] * tgt + t[:, None, None] * eps
        v = eps - tgt
        ty, tx, side = b["window"]
        g = self.codec.grid
        rr, cc = torch.meshgrid(torch.arange(ty, ty + side), torch.arange(tx, tx + side), indexing="ij")
        rows = (rr * g + cc).flatten()
        tokens, pooled = te(b["text"].to(d))
        if self.sd3:
            pred = self._sd3_forward(tr, xt, x0, b["mpx"].to(d), t, tokens, pooled, (ty, tx, side))
        else:
            self.adapter.set_instruction(pooled, tr)
            try:
                pred = self._flux2_forward(tr, xt, x0, b["mpx"].to(d), t, tokens, b["ref"], b.get("aligned"), rows)
            finally:
                self.adapter.set_instruction(None, tr)  # (a graph-holding tensor must not outlive the step)
        return pred, v[:, rows], b["tmask"][:, rows].to(d)

    def _flux2_forward(self, tr, xt, x0, mpx, t, tokens, ref, aligned, rows):
        a = self.adapter
        aligned = None if aligned is None else aligned.to(self.device)[:, rows]
        feats = a.image_features(xt[:, rows], x0[:, rows], mpx[:, rows], aligned)
        nref = 0
        if ref is not None:
            ref = ref.to(self.device)
            nref = ref.shape[1]
            feats = torch.cat([feats, a.reference_features(ref, feats.shape[-1])], 1)
        img_ids, _ = a._ids(rows, nref)
        L = tokens.shape[1]
        txt_ids = torch.zeros(L, 4, dtype=torch.long)
        txt_ids[:, 3] = torch.arange(L)
        a._num_txt = L
        a.ctx.set_image_rows(rows)
        if tr is not self.transformer and a.needs_processors:
            raise ValueError("with a locality bias, predict() runs the training transformer only")
        out = tr(hidden_states=feats, encoder_hidden_states=tokens, timestep=t, img_ids=img_ids.to(self.device),
                 txt_ids=txt_ids.to(self.device), guidance=None, return_dict=False)[0]
        return out[:, : len(rows)]

    def _sd3_forward(self, tr, xt, x0, mpx, t, tokens, pooled, window):
        p, r = self.codec.patch, self.codec.resolution
        ty, tx, side = window
        batch = xt.shape[0]

        def spatial(tok, c=3):
            return torch.stack([unpatchify(tok[i], p, r, r, c) for i in range(batch)]).permute(0, 3, 1, 2)

        m = spatial(mpx, 1) * 2 - 1
        x = torch.cat([spatial(xt), spatial(x0), m], 1)[:, :, ty * p : (ty + side) * p, tx * p : (tx + side) * p]
        pe = tr.pos_embed
        full = pe.pos_embed.reshape(1, pe.pos_embed_max_size, pe.pos_embed_max_size, -1)

        def window_pos(height, width):
            h, w = height // pe.patch_size, width // pe.patch_size
            return full[:, ty : ty + h, tx : tx + w].reshape(1, h * w, -1)

        pe.cropped_pos_embed = window_pos  # real positions of the window (instance override)
        try:
            out = tr(hidden_states=x, encoder_hidden_states=tokens, pooled_projections=pooled,
                     timestep=t * 1000.0, return_dict=False)[0]
        finally:
            del pe.cropped_pos_embed
        out = out.permute(0, 2, 3, 1)  # (B, side*p, side*p, 3) → tokens in window order
        return torch.stack([patchify(out[i], p) for i in range(batch)])

    def loss(self, b: dict, **kw) -> torch.Tensor:
        pred, v, tm = self.predict(b, **kw)
        per_tok = (pred.float() - v).square().mean(-1)
        w = torch.where(tm, 1.0, UNMASKED_WEIGHT)
        return (per_tok * w).sum() / w.sum()

    def lr_at(self, progress: float) -> float:
        warm = min(1.0, (self.step + 1) / max(1, self.warmup))
        if self.schedule == "const":
            return self.lr * warm
        return self.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    def train_step(self, b: dict, progress: float = 0.0) -> float:
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(progress) * group.get("lr_mult", 1.0)
        loss = self.loss(b)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.transformer.parameters()) + list(self.text_encoder.parameters()), 1.0)
        self.opt.step()
        self.step += 1
        if self.ema_tr is not None:
            decay = min(self.ema_decay, (1 + self.step) / (10 + self.step))
            with torch.no_grad():
                for src, dst in ((self.transformer, self.ema_tr), (self.text_encoder, self.ema_te)):
                    for ps, pd in zip(src.parameters(), dst.parameters()):
                        pd.lerp_(ps, 1 - decay)
        return float(loss.detach())

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict:
        s = {"model": self.model_name, "step": self.step, "elapsed": self.elapsed, "history": self.history,
             "transformer": self.transformer.state_dict(), "text_encoder": self.text_encoder.state_dict(),
             "opt": self.opt.state_dict(), "config": self.config()}
        if self.ema_tr is not None:
            s["ema_transformer"] = self.ema_tr.state_dict()
            s["ema_text_encoder"] = self.ema_te.state_dict()
        return s

    def config(self) -> dict:
        return {"model": self.model_name, "batch": self.batch, "lr": self.lr, "schedule": self.schedule,
                "ema": self.ema_decay, "seed": self.seed, "t_sampling": self.t_sampling,
                "full_prob": self.full_prob, "warmup": self.warmup, "unmasked_weight": UNMASKED_WEIGHT,
                "task_mix": self.task_mix, "mb_op_mix": self.mb_op_mix, "text_lr_mult": self.text_lr_mult,
                "blank_tasks": list(self.codec.blank_tasks), "codec": self.codec.to_meta()}

    def save(self, path: Path | None = None) -> Path:
        path = path or self.out / "ckpt.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(self.state(), tmp)
        tmp.replace(path)
        return path

    def load(self, path: Path | None = None) -> None:
        s = torch.load(path or self.out / "ckpt.pt", map_location=self.device, weights_only=False)
        if s["model"] != self.model_name:
            raise ValueError(f"checkpoint is for {s['model']}, not {self.model_name}")
        if checkpoint_codec(s, self.model_name) != self.codec:
            raise ValueError(f"checkpoint's codec {checkpoint_codec(s, self.model_name)} differs from the run's "
                             f"{self.codec}; resume with the checkpoint's settings")
        self.transformer.load_state_dict(s["transformer"])
        self.text_encoder.load_state_dict(s["text_encoder"])
        self.opt.load_state_dict(s["opt"])
        if self.ema_tr is not None and "ema_transformer" in s:
            self.ema_tr.load_state_dict(s["ema_transformer"])
            self.ema_te.load_state_dict(s["ema_text_encoder"])
        self.step, self.elapsed, self.history = s["step"], s["elapsed"], [tuple(h) for h in s["history"]]

    def inference_adapter(self, ema: bool = True):
        """A CPU fp32 adapter holding the (EMA) weights, for sampling / evaluation / shipping."""
        tr = self.ema_tr if (ema and self.ema_tr is not None) else self.transformer
        te = self.ema_te if (ema and self.ema_te is not None) else self.text_encoder
        attached = self.adapter._original_processors is not None
        self.adapter.detach()  # copy the modules, not our processors (they point back at self.adapter)
        try:
            tr2, te2 = copy.deepcopy(tr).float().cpu().eval(), copy.deepcopy(te).float().cpu().eval()
        finally:
            if attached:
                self.adapter.attach()
        return adapter_class(self.adapter.family)(tr2, te2, copy.deepcopy(self.codec), self.model_name)

    def init_from(self, folder: str | Path) -> list[str]:
        """Warm start: every weight of a model folder whose name and shape match, raw and EMA alike; an
        input projection that gained feature columns keeps the old columns and zeros the new ones (the
        start computes what the folder's model computes). Returns the parameters left at seed values."""
        src = load_model_folder(folder)
        fresh = []
        for mine, theirs, emas in ((self.transformer, src.transformer, self.ema_tr),
                                   (self.text_encoder, src.text_encoder, self.ema_te)):
            state, old = mine.state_dict(), theirs.state_dict()
            for name, value in state.items():
                w = old.get(name)
                if w is not None and w.shape == value.shape:
                    state[name] = w.to(value.dtype)
                elif w is not None and w.ndim == 2 and w.shape[0] == value.shape[0] and w.shape[1] < value.shape[1]:
                    state[name] = torch.cat([w.to(value.dtype), value.new_zeros(value.shape[0],
                                                                                value.shape[1] - w.shape[1])], 1)
                else:
                    fresh.append(name)
            mine.load_state_dict(state)
            if emas is not None:
                emas.load_state_dict(state)
        return fresh

    # ------------------------------------------------------------------ reports
    def plot_loss(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        if not self.history:
            return
        steps = np.array([h[0] for h in self.history])
        loss = np.array([h[2] for h in self.history])
        k = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(k) / k, mode="valid")
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, loss, alpha=0.25, lw=0.6, label="batch")
        ax.plot(steps[k - 1 :], smooth, lw=1.5, label=f"mean of {k}")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("masked flow-matching loss")
        ax.set_title(f"{self.model_name}: {self.step} steps, {self.elapsed / 60:.1f} min")
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.out / "loss.png", dpi=110)
        plt.close(fig)
        (self.out / "history.json").write_text(json.dumps(self.history))

    def sample_grid(self, path: Path, examples: list[EditExample] | None = None) -> None:
        tasks = ("mb",) if self.sd3 else TASKS
        examples = examples or [e for e in heldout_examples(2) if e.task in tasks]
        render_grid(self.inference_adapter(), examples, path, title=f"{self.model_name} step {self.step}")


def checkpoint_codec(state: dict, model: str) -> CodecConfig:
    """The codec a checkpoint was trained with (older checkpoints stored only ``blank_tasks``)."""
    config = state.get("config", {})
    if "codec" in config:
        return CodecConfig.from_meta(config["codec"])
    codec = embedded_codec(model)
    codec.blank_tasks = tuple(config.get("blank_tasks", ()))
    return codec


def run_codec(model: str, args, ckpt: Path, portable: Path | None = None) -> CodecConfig:
    """A resumed run keeps its checkpoint's codec (flags may only repeat it); a new run takes the
    embedded codec with the flags' changes. Without ``ckpt``, a ``portable`` checkpoint stands for it."""
    given = {k: getattr(args, k, None) for k in ("blank_tasks", "ref_mode", "locality", "patch_context", "ref_size")}
    given = {k: v for k, v in given.items() if v is not None}
    parse = {"blank_tasks": lambda v: tuple(t for t in v.split(",") if t), "ref_mode": str,
             "locality": lambda v: tuple(float(x) for x in v.split(",") if x), "patch_context": lambda v: v == "yes",
             "ref_size": int}
    resuming = args.resume or args.ship
    if resuming and (ckpt.exists() or (portable is not None and portable.exists())):
        state = (torch.load(ckpt, map_location="cpu", weights_only=False) if ckpt.exists()
                 else portable_config(portable))
        codec = checkpoint_codec(state, model)
        for k, v in given.items():
            if getattr(codec, k) != parse[k](v):
                raise SystemExit(f"--{k.replace('_', '-')} {v} differs from the checkpoint's "
                                 f"{getattr(codec, k)}; a resumed run keeps its codec")
        return codec
    codec = embedded_codec(model)
    for k, v in given.items():
        setattr(codec, k, parse[k](v))
    return codec


def parse_shares(text: str | None, names, flag: str, normalise: bool = True) -> dict[str, float] | None:
    """``fs=0.2,vton=0.15,mb=0.65`` → {name: share} over ``names`` (normalised to 1 unless told not to)."""
    if not text:
        return None
    mix = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in names:
            raise SystemExit(f"{flag}: {name!r} is not one of {', '.join(names)}")
        try:
            mix[name] = float(share)
        except ValueError:
            raise SystemExit(f"{flag}: {part!r} is not name=share") from None
    total = sum(mix.values())
    if total <= 0 or any(v < 0 for v in mix.values()):
        raise SystemExit(f"{flag}: shares must be ≥ 0 and not all 0")
    return {k: v / total for k, v in mix.items()} if normalise else mix


def parse_task_mix(text: str | None, model: str) -> dict[str, float] | None:
    """``fs=0.2,vton=0.15,mb=0.65`` → shares normalised to 1, over the model's own tasks."""
    return parse_shares(text, list(TASK_PROBS[model]), "--task-mix")


def save_all(trainer: Trainer, portable: Path | None) -> None:
    trainer.save()
    if portable is not None:
        save_portable(trainer, portable)
    trainer.plot_loss()


def ship(trainer: Trainer, folder: Path | None = None, ema: bool = True) -> Path:
    """Save the (EMA) weights as fp16 safetensors in the embedded model folder (loaded back as fp32)."""
    folder = folder or WEIGHTS_DIR / trainer.model_name
    adapter = trainer.inference_adapter(ema)
    adapter.transformer.half()
    adapter.text_encoder.half()
    save_model(adapter, folder)
    return folder


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.model.train", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="sakura-tiny", choices=["sakura-tiny", "sakura-tiny-sd3"])
    ap.add_argument("--out", default=None, help="run folder (default runs/<model>)")
    ap.add_argument("--minutes", type=float, default=60.0, help="training time budget (total over resumes)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (overrides the LR horizon)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--schedule", choices=["cosine", "const"], default="cosine")
    ap.add_argument("--ema", type=float, default=0.999, help="EMA decay (0 = off)")
    ap.add_argument("--t-sampling", choices=["mixed", "logit", "uniform"], default="mixed")
    ap.add_argument("--full-prob", type=float, default=0.03, help="share of batches on the whole token grid")
    ap.add_argument("--blank-tasks", default=None, help="comma list of tasks trained fill-style (template hidden "
                                                         "under the mask), e.g. fs,vton; default: the model's codec")
    ap.add_argument("--ref-mode", default=None, choices=["tokens", "aligned", "both"],
                    help="how references enter (default: the model's codec)")
    ap.add_argument("--ref-size", default=None, help="side a reference is prepared at (default: the model's codec)")
    ap.add_argument("--patch-context", default=None, choices=["yes", "no"],
                    help="no: masked tokens see no template pixels outside the mask (default: the model's codec)")
    ap.add_argument("--locality", default=None, help="per-head distance-bias slopes, e.g. 0,0.25,0.5,1 "
                                                      "(default: the model's codec)")
    ap.add_argument("--qk-gain", type=float, default=1.0, help="a new run starts with every attention logit "
                                                                  "multiplied by this (q/k norm gains × √gain)")
    ap.add_argument("--init-from", default=None, help="warm start a new run from a model folder's weights")
    ap.add_argument("--portable", default=None, help="also write a compact resumable checkpoint here at every "
                                                      "save (fp16 weights, int8 √v); resume from it when the run "
                                                      "folder has no ckpt.pt")
    ap.add_argument("--task-mix", default=None, help="share of batches per task, e.g. fs=0.2,vton=0.15,mb=0.65 "
                                                      "(default: TASK_PROBS; may change on a resume)")
    ap.add_argument("--mb-op-mix", default=None, help="relative weight of text-edit ops, the rest 1, e.g. color=4 "
                                                        "(default: uniform; may change on a resume)")
    ap.add_argument("--text-lr-mult", type=float, default=1.0, help="the text encoder's LR over the transformer's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-minutes", type=float, default=10.0)
    ap.add_argument("--sample-minutes", type=float, default=15.0)
    ap.add_argument("--ship", action="store_true", help="save the run's EMA weights to sakura/weights/<model> and exit")
    ap.add_argument("--ship-to", default=None, help="folder for --ship (default sakura/weights/<model>)")
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out or f"runs/{args.model}")
    device = torch.device(args.device) if args.device else default_device()
    portable = Path(args.portable) if args.portable else None
    codec = run_codec(args.model, args, out / "ckpt.pt", portable)
    tr = Trainer(args.model, out, args.batch, args.lr, args.schedule, args.ema, args.seed, args.t_sampling,
                 args.full_prob, device, codec=codec, task_mix=parse_task_mix(args.task_mix, args.model),
                 mb_op_mix=parse_shares(args.mb_op_mix, EDIT_OPS, "--mb-op-mix", False),
                 text_lr_mult=args.text_lr_mult)
    if args.resume or args.ship:
        if (out / "ckpt.pt").exists():
            tr.load()
            print(f"resumed {out / 'ckpt.pt'} at step {tr.step} ({tr.elapsed / 60:.1f} min)")
        elif portable is not None and portable.exists():
            load_portable(tr, portable)
            print(f"resumed the portable checkpoint {portable} at step {tr.step} ({tr.elapsed / 60:.1f} min)")
        elif args.ship:
            raise SystemExit(f"no checkpoint in {out}")
    if args.init_from and tr.step == 0:
        fresh = tr.init_from(args.init_from)
        print(f"warm start from {args.init_from}; at seed values: {', '.join(fresh) or 'none'}")
    if args.qk_gain != 1.0 and tr.step == 0:  # a new run only: a resumed one has its gains
        sharpen(tr.adapter, args.qk_gain)
        if tr.ema_tr is not None:
            tr.ema_tr.load_state_dict(tr.transformer.state_dict())
    if args.ship:
        folder = ship(tr, Path(args.ship_to) if args.ship_to else None)
        print(f"shipped {args.model} step {tr.step} → {folder}")
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(
        json.dumps(
            tr.config()
            | {"minutes": args.minutes, "steps": args.steps, "threads": args.threads, "device": str(device)},
            indent=1,
        )
    )
    budget = args.minutes * 60
    bar = tqdm(total=int(budget), initial=int(min(tr.elapsed, budget)), unit="s", dynamic_ncols=True,
               desc=args.model, mininterval=5)
    last_ckpt = last_sample = time.perf_counter()
    start_elapsed, t0 = tr.elapsed, time.perf_counter()
    recent: list[float] = []
    stop = []  # SIGTERM / Ctrl-C: finish the step, save, exit (resume with --resume)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        progress = tr.elapsed / budget
        if args.steps:
            progress = max(progress, tr.step / args.steps)
        if progress >= 1.0:
            break
        b = tr.make_batch(tr.step)
        loss = tr.train_step(b, progress)
        now = time.perf_counter()
        tr.elapsed = start_elapsed + (now - t0)
        tr.history.append((tr.step, round(tr.elapsed, 2), round(loss, 5)))
        recent = (recent + [loss])[-50:]
        bar.n = int(min(tr.elapsed, budget))
        bar.set_postfix(step=tr.step, loss=f"{np.mean(recent):.4f}", lr=f"{tr.lr_at(progress):.1e}",
                        spb=f"{tr.elapsed / max(1, tr.step):.2f}", refresh=False)
        bar.update(0)
        if now - last_ckpt > args.ckpt_minutes * 60:
            save_all(tr, portable)
            last_ckpt = time.perf_counter()
        if now - last_sample > args.sample_minutes * 60:
            tr.sample_grid(out / f"samples_{tr.step:06d}.png")
            last_sample = time.perf_counter()
            t0, start_elapsed = time.perf_counter(), tr.elapsed  # sampling time is not training time
    bar.close()
    if stop:
        print(f"stopped at step {tr.step}; saved (resume with --resume)")
    save_all(tr, portable)
    if not stop:
        tr.sample_grid(out / "samples_final.png")
    print(json.dumps({"model": args.model, "steps": tr.step, "minutes": round(tr.elapsed / 60, 2),
                      "final_loss_mean50": float(np.mean(recent)) if recent else None}))


if __name__ == "__main__":
    main()
