"""Pilot: what a reuse does to the output, against what it is priced at. Per shard with a previous step: masked runs
of the template's profiling requests with that shard's layers on the previous step's exact K/V and the rest exact
(what the reuse fallback runs, less the kept level's own error), their masked MSE against the exact-cache output,
beside the price the runtime and the optimum give it (``build.step_error`` × the shard's output weight).

    python docs/results/issue32/policy14/reuse_price.py PACKS TEMPLATE …
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.formats import encoding_from_header
from sakura.formats.container import header_size
from sakura.offline.builder import capture_request, profile_edit_requests
from sakura.offline.output_weights import MAX_REQUESTS, masked_mse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("packs", type=Path)
    ap.add_argument("templates", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(1)
    catalog = load_catalog()
    print("| template | shard | priced (step error × weight) | measured (mean over requests) | measured / priced |")
    print("|---|---|---|---|---|")
    for tid in a.templates:
        template = catalog.get(tid)
        with open(a.packs / f"{tid}.pack", "rb") as f:
            first8 = f.read(8)
            enc = encoding_from_header("sakura", first8 + f.read(header_size(first8) - 8))
        model = model_for(template)
        cache = model.capture(capture_request(template, model)).to(torch.float16)
        exact = {key: cache.get(*key) for key in cache.k}
        requests = profile_edit_requests(template, model)[:MAX_REQUESTS]
        refs = [model.masked_edit(r, lambda s, layer: exact[(s, layer)]).image for r in requests]
        g = enc.info.geometry
        per_step = g.num_layers // g.shard_size
        ratios = []
        for u in enc.units:
            step_error = enc.step_error(u)
            if step_error is None:
                continue
            step, l0 = u.index // per_step, (u.index % per_step) * g.shard_size
            kv = dict(exact)
            for layer in range(l0, l0 + g.shard_size):
                kv[(step, layer)] = exact[(step - 1, layer)]
            measured = float(np.mean([masked_mse(model.masked_edit(r, lambda s, layer: kv[(s, layer)]).image, ref,
                                                 r.mask) for r, ref in zip(requests, refs)]))
            priced = step_error * u.weight
            ratios.append(measured / priced if priced > 0 else float("nan"))
            print(f"| {tid} | {u.index} | {priced:.3g} | {measured:.3g} | {ratios[-1]:.2f} |")
        print(f"| {tid} | geometric mean | | | {float(np.exp(np.nanmean(np.log(ratios)))):.2f} |")


if __name__ == "__main__":
    main()
