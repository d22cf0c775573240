"""Evaluate the embedded models: edit quality on held-out synthetic edits and attention structure.

    python -m sakura.model.evaluate [--out docs] [--n-per-task 6] [--heldout 4]

1. **Edit quality.** On held-out images, faces, textures and masks (``edit_data.heldout_examples``),
   masked-region PSNR against the synthesized ground truth of: copying the template, the seeded
   (untrained) model, and the trained model (the shipped weights, or ``--weights DIR``); masked SSIM
   likewise.
2. **Attention structure** (the paper's Fig. 2 observation) on the embedded catalog: for each
   template, capture its cache, run the masked edit with the attention probe for the 5 profiling
   requests and ``--heldout`` evaluation requests. Per cache unit (step, layer) the probe gives the
   squared attention mass each reusable token receives from the masked queries. Reported: the
   share of mass held by the top 10 % tokens (per request, averaged), and the overlap of the top-10 %
   set of the summed profiling importance with each held-out request's top-10 % set.
3. **Cache sensitivity** on the embedded catalog: masked PSNR of the masked run against the same run
   on the exact FP16 cache (first ``--sensitivity-requests`` evaluation requests) when every reusable
   K/V is zeroed, quantised per token (min–max over the channels) to INT2 or INT4, or replaced by
   another template's image captured under this template's mask; and Fig. 2's share of the
   INT2-induced error carried by the top decile of tokens by profiled importance.

Writes ``model_eval.json``, ``samples.png`` (sakura-tiny) and ``samples_sd3.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from sakura.editing import model_for
from sakura.formats import encoding_from_header
from sakura.formats.intq import decode_unit, encode_unit
from sakura.model.base import EditRequest
from sakura.model.edit_data import EDIT_OPS, TASKS, EditSynth, heldout_examples
from sakura.model.embedded import WEIGHTS_DIR, load_model, load_model_folder, seeded_model
from sakura.model.sample_grid import render_catalog_edits, render_grid
from sakura.offline.builder import build_template, capture_request
from sakura.quality import ssim

TOP = 0.10


def masked_psnr(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
    mse = float(np.mean((a[mask].astype(np.float64) - b[mask].astype(np.float64)) ** 2))
    return 100.0 if mse == 0 else min(100.0, 10 * math.log10(1.0 / mse))


def _request(e) -> EditRequest:
    return EditRequest(e.template, e.mask, e.task, e.prompt or "", e.reference, seed=0)


def edit_quality(models: dict, examples, ssim_out: dict | None = None) -> dict:
    """Per task: mean masked PSNR of copy-the-template and of each model's full edit (and, into
    ``ssim_out``, the same for masked SSIM)."""
    rows: dict[str, dict[str, list[float]]] = {}
    ssims: dict[str, dict[str, list[float]]] = {}
    for e in examples:
        r = rows.setdefault(e.task, {"copy": []} | {k: [] for k in models})
        s = ssims.setdefault(e.task, {"copy": []} | {k: [] for k in models})
        r["copy"].append(masked_psnr(e.template, e.target, e.mask))
        s["copy"].append(ssim(e.template, e.target, e.mask))
        for name, adapter in models.items():
            img = adapter.full_edit(_request(e)).image
            r[name].append(masked_psnr(img, e.target, e.mask))
            s[name].append(ssim(img, e.target, e.mask))
    if ssim_out is not None:
        ssim_out.update({task: {k: round(float(np.mean(v)), 4) for k, v in r.items()} for task, r in ssims.items()})
    out = {task: {k: round(float(np.mean(v)), 3) for k, v in r.items()} | {"n": len(r["copy"])}
           for task, r in rows.items()}
    allv = {k: [x for r in rows.values() for x in r[k]] for k in next(iter(rows.values()))}
    out["all"] = {k: round(float(np.mean(v)), 3) for k, v in allv.items()} | {"n": len(allv["copy"])}
    return out


def mb_op_skill(adapter, per_op: int = 3, seed: int = 7) -> dict:
    """Per text-edit op, the trained model's masked PSNR over copying the template on ``per_op``
    held-out edits (the task-level mean hides an op the model has not learnt, such as a colour)."""
    synth = EditSynth("heldout")
    out = {}
    for oi, op in enumerate(EDIT_OPS):
        gains = []
        for i in range(per_op):
            e = synth.sample(np.random.default_rng([seed, oi, i]), "mb", keep_prob=0.0, mb_op=op)
            img = adapter.full_edit(_request(e)).image
            gains.append(masked_psnr(img, e.target, e.mask) - masked_psnr(e.template, e.target, e.mask))
        out[op] = round(float(np.mean(gains)), 2)
    return out


def _top(v: torch.Tensor, k: int) -> set[int]:
    return set(torch.topk(v, k).indices.tolist())


def catalog_requests(template, heldout: int):
    img, mask = template.image(), template.mask()

    def req(r):
        ref = r.reference_image() if r.reference is not None else None
        return EditRequest(img, mask, template.task, r.prompt or "", ref, seed=template.seed)

    return (EditRequest(img, mask, template.task, "", None, seed=template.seed),
            [req(r) for r in template.profile_requests], [req(r) for r in template.eval_requests[:heldout]])


def attention_structure(adapter, base: EditRequest, profile: list[EditRequest], held: list[EditRequest]) -> dict:
    """Top-10 % mass share and profiling/held-out top-10 % overlap, averaged over cache units."""
    cache = adapter.capture(base)
    imp_p = [adapter.masked_edit(r, cache.provider(), probe=True).importance for r in profile]
    imp_h = [adapter.masked_edit(r, cache.provider(), probe=True).importance for r in held]
    units = sorted(imp_p[0])
    n = imp_p[0][units[0]].numel()
    k = max(1, int(math.ceil(TOP * n)))
    share, overlap, share_by_step = [], [], {}
    for u in units:
        for imp in imp_p + imp_h:
            v = imp[u].float()
            s = float(torch.topk(v, k).values.sum() / v.sum().clamp(min=1e-30))
            share.append(s)
            share_by_step.setdefault(u[0], []).append(s)
        prof = _top(sum(imp[u].float() for imp in imp_p), k)
        for imp in imp_h:
            overlap.append(len(prof & _top(imp[u].float(), k)) / k)
    return {"top10_share": float(np.mean(share)), "top10_overlap": float(np.mean(overlap)),
            "top10_share_by_step": {str(s): round(float(np.mean(v)), 4) for s, v in sorted(share_by_step.items())},
            "reusable_tokens": n, "units": len(units), "profile": len(profile), "heldout": len(held)}


def per_token_quant(x: torch.Tensor, bits: int) -> torch.Tensor:
    """(n, d) → per-token asymmetric min–max quantisation to ``bits`` (IntQ's codec on the transpose)."""
    n, d = x.shape
    return decode_unit(encode_unit(x.t().contiguous(), bits), d, n, bits).t().contiguous()


def cache_sensitivity(adapter, base: EditRequest, profile: list[EditRequest], held: list[EditRequest],
                      other_image: np.ndarray | None = None, deciles: bool = True) -> dict:
    """Masked PSNR vs the FP16-cache output under degraded reusable K/V — zeroed, per-token INT2 / INT4,
    another image's cache — and of a full local run with no cache at all; plus the top decile's share
    of INT2-induced error (INT2 applied to one importance decile at a time)."""
    cache = adapter.capture(base).to(torch.float16)
    exact = {key: cache.get(*key) for key in cache.k}
    refs = [adapter.masked_edit(r, lambda s, l: exact[(s, l)]).image for r in held]

    def psnr(kv) -> float:
        return float(np.mean([masked_psnr(adapter.masked_edit(r, lambda s, l: kv[(s, l)]).image, ref, r.mask)
                              for r, ref in zip(held, refs)]))

    quant = {b: {key: (per_token_quant(k.float(), b), per_token_quant(v.float(), b)) for key, (k, v) in exact.items()}
             for b in (2, 4)}
    out = {"zeroed": psnr({key: (torch.zeros_like(k), torch.zeros_like(v)) for key, (k, v) in exact.items()}),
           "int2": psnr(quant[2]), "int4": psnr(quant[4]),
           "local_no_cache": float(np.mean([masked_psnr(adapter.full_edit(r).image, ref, r.mask)
                                            for r, ref in zip(held, refs)]))}
    if other_image is not None:
        other = adapter.capture(EditRequest(other_image, base.mask, base.task, "", None, seed=base.seed))
        out["other"] = psnr({key: other.get(*key) for key in other.k})
    if deciles:
        imp = [adapter.masked_edit(r, cache.provider(), probe=True).importance for r in profile]
        order = {key: torch.argsort(sum(i[key] for i in imp), descending=True).chunk(10) for key in exact}
        errs = []
        for d in range(10):
            kv = {}
            for key, (k, v) in exact.items():
                rows = order[key][d]
                k2, v2 = k.float().clone(), v.float().clone()
                k2[rows], v2[rows] = quant[2][key][0][rows], quant[2][key][1][rows]
                kv[key] = (k2, v2)
            errs.append(sum(float(np.mean((adapter.masked_edit(r, lambda s, l: kv[(s, l)]).image - ref) ** 2))
                            for r, ref in zip(held, refs)))
        out["int2_top_decile_error_share"] = errs[0] / max(sum(errs), 1e-30)
    return {k: round(v, 3) for k, v in out.items()} | {"requests": len(held)}


def pack_sensitivity(template, model_path: str | Path, held: list[EditRequest]) -> dict:
    """Masked PSNR vs the FP16-cache output of SAKURA's smallest and top stored levels, on a pack built
    with the default build settings (every shard at its smallest / largest level), with each level's
    bytes as a share of the FP16 cache."""
    import tempfile

    adapter = model_for(template, model_path)
    with tempfile.TemporaryDirectory() as tmp:
        report = build_template(template, tmp, model_path=model_path, encodings=("sakura", "sakura-v1"))
        raw = (Path(tmp) / f"{template.id}.pack").read_bytes()
    enc = encoding_from_header("sakura", raw).fresh()
    cache = adapter.capture(capture_request(template, adapter)).to(torch.float16)
    refs = [adapter.masked_edit(r, cache.provider()).image for r in held]
    out = {}
    for name, pick in (("smallest_level", min), ("top_level", max)):
        kv, nbytes = {}, 0
        for unit in enc.units:
            level = pick(unit.levels, key=lambda lv: lv.nbytes)
            ranges = enc.ranges(unit, level)
            nbytes += sum(n for _, n in ranges)
            kv.update(enc.decode(unit, level, [raw[o:o + n] for o, n in ranges]))
        out[name] = round(float(np.mean([masked_psnr(adapter.masked_edit(r, lambda s, l: kv[(s, l)]).image, ref,
                                                     r.mask) for r, ref in zip(held, refs)])), 3)
        out[f"{name}_fp16_share"] = round(nbytes / report.fp16_bytes, 5)
    return out


def synthetic_templates(name: str, heldout: int):
    """Fallback when no catalog is installed: held-out synthetic templates with random requests."""
    synth = EditSynth("heldout")
    tasks = ("mb",) if name.endswith("sd3") else TASKS
    for ti, task in enumerate(tasks):
        rng = np.random.default_rng([99, ti])
        exs = [synth.sample(rng, task, keep_prob=0.0) for _ in range(5 + heldout)]
        tpl, mask = exs[0].template, exs[0].mask
        reqs = [EditRequest(tpl, mask, task, e.prompt or "", e.reference) for e in exs]
        yield f"synthetic-{task}", EditRequest(tpl, mask, task, "", None), reqs[:5], reqs[5:]


def catalog_templates(name: str, heldout: int, with_template: bool = False, only: set[str] | None = None):
    try:
        from sakura.catalog import load_catalog  # ImportError: synthetic templates instead
    except ImportError:
        yield from synthetic_templates(name, heldout)
        return
    for t in load_catalog():
        if t.model == name and (not only or t.id in only):
            yield (t.id, *catalog_requests(t, heldout)) + ((t,) if with_template else ())


SENSITIVITY_KEYS = ("int2", "int4", "zeroed", "other", "local_no_cache", "smallest_level", "top_level",
                    "smallest_level_fp16_share", "top_level_fp16_share")


def by_task(per_template: dict, tasks: dict) -> dict:
    """Per task, the mean of each sensitivity measure over that task's templates."""
    out = {}
    for task in sorted(set(tasks.values())):
        rows = [v for tid, v in per_template.items() if tasks[tid] == task]
        out[task] = {k: round(float(np.mean([r[k] for r in rows])), 3) for k in SENSITIVITY_KEYS
                     if all(k in r for r in rows)} | {"templates": len(rows)}
    return out


def trained_adapter(name: str, weights: str | None):
    if weights:
        return load_model_folder(weights)
    if not (WEIGHTS_DIR / name / "sakura.json").is_file():
        raise SystemExit(f"no trained weights for {name} in {WEIGHTS_DIR / name}: train and ship them first "
                         f"(python -m sakura.model.train --model {name} ... then --ship)")
    return load_model(name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m sakura.model.evaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="sakura-tiny,sakura-tiny-sd3")
    ap.add_argument("--weights", default=None, help="a model folder to evaluate instead of the shipped weights "
                                                     "(only with a single --models entry)")
    ap.add_argument("--n-per-task", type=int, default=6, help="held-out synthetic edits per task")
    ap.add_argument("--heldout", type=int, default=4, help="held-out catalog requests per template (>= 3)")
    ap.add_argument("--out", default="docs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-sensitivity", action="store_true")
    ap.add_argument("--skip-packs", action="store_true", help="no pack build for smallest / top level PSNR")
    ap.add_argument("--templates", default=None,
                    help="comma list of catalog template ids (default: all of the model's)")
    ap.add_argument("--sensitivity-requests", type=int, default=3, help="evaluation requests per template for "
                                                                         "the cache sensitivity")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    only = {t for t in args.templates.split(",") if t} if args.templates else None
    report: dict = {"top_fraction": TOP, "n_per_task": args.n_per_task, "models": {}}
    for name in names:
        t0 = time.perf_counter()
        trained = trained_adapter(name, args.weights)
        seeded = seeded_model(name, codec=replace(trained.codec))  # the same architecture, untrained
        tasks = ("mb",) if name.endswith("sd3") else TASKS
        examples = [e for e in heldout_examples(args.n_per_task) if e.task in tasks]
        print(f"[{name}] edit quality on {len(examples)} held-out synthetic edits …", flush=True)
        ssim_masked: dict = {}
        quality = edit_quality({"seeded": seeded, "trained": trained}, tqdm(examples, leave=False), ssim_masked)
        rep = {"psnr_masked": quality, "ssim_masked": ssim_masked, "attention": {}}
        if "mb" in tasks:
            rep["mb_op_skill_over_copy"] = mb_op_skill(trained)
        if not args.skip_attention:
            att_tpls = list(catalog_templates(name, args.heldout, only=only))
            for tid, base, prof, held in tqdm(att_tpls, desc="attention", leave=False):
                rep["attention"][tid] = {w: attention_structure(a, base, prof, held)
                                         for w, a in (("trained", trained), ("seeded", seeded))}
            att = rep["attention"]
            if att:
                rep["attention_mean"] = {w: {m: round(float(np.mean([v[w][m] for v in att.values()])), 4)
                                             for m in ("top10_share", "top10_overlap")} for w in ("trained", "seeded")}
        if not args.skip_sensitivity:
            tpls = list(catalog_templates(name, max(args.heldout, args.sensitivity_requests), True, only))
            per_template = {}
            for i, (tid, base, prof, held, tpl) in enumerate(tqdm(tpls, desc="sensitivity", leave=False)):
                other = next((o[1].template for o in tpls[i + 1:] + tpls[:i] if o[1].task == base.task), None)
                held = held[:args.sensitivity_requests]
                per_template[tid] = cache_sensitivity(trained, base, prof, held, other)
                if not args.skip_packs:
                    per_template[tid] |= pack_sensitivity(tpl, args.weights, held)
            rep["sensitivity"] = by_task(per_template, {t[0]: t[1].task for t in tpls})
            rep["sensitivity_templates"] = per_template
        grid_ex = [e for e in heldout_examples(2) if e.task in tasks]
        suffix = "" if name == "sakura-tiny" else f"_{name.split('-')[-1]}"
        render_grid(trained, grid_ex, out / f"samples{suffix}.png",
                    title=f"{name}: held-out synthetic edits (trained weights)",
                    extra={"seeded model": lambda e, s=seeded: s.full_edit(_request(e)).image})
        render_catalog_edits(trained, [t[-1] for t in catalog_templates(name, 0, True, only)],
                             out / f"edits{suffix}.png", title=f"{name}: catalog edits (held-out requests)")
        rep["seconds"] = round(time.perf_counter() - t0, 1)
        report["models"][name] = rep
        print(json.dumps({name: {"psnr_masked": quality["all"], "attention_mean": rep.get("attention_mean"),
                                 "sensitivity": rep.get("sensitivity")}}), flush=True)
    path = out / "model_eval.json"
    if path.exists() and set(names) != {"sakura-tiny", "sakura-tiny-sd3"}:  # keep the other model's numbers
        old = json.loads(path.read_text())
        report["models"] = old.get("models", {}) | report["models"]
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
