"""What a reuse does to the output, against what it is priced at. Per shard with a previous step: masked runs of the
template's profiling requests with that shard's layers on the previous step's exact K/V and the rest exact (what the
reuse fallback runs, less the kept level's own error; `measure_output_weights(reuse=True)`), their masked MSE against
the exact-cache output, beside the price the runtime and the optimum gave it before session 36
(``build.step_error`` × the shard's output weight).

    python docs/results/issue32/policy14/reuse_price.py PACKS TEMPLATE …
"""

import argparse
from pathlib import Path

import numpy as np
import torch

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.formats import FORMATS
from sakura.offline.builder import capture_request, profile_edit_requests
from sakura.offline.level_errors import file_reader
from sakura.offline.output_weights import MAX_REQUESTS, measure_output_weights


def measured_reuse(packs: Path, template_id: str):
    """The template's SAKURA pack as its own errors price it, and each shard's measured reuse MSE (None: step 0)."""
    template = load_catalog().get(template_id)
    path = packs / f"{template_id}.pack"
    fmt = FORMATS["sakura"]
    enc = fmt.encoding_cls(fmt.open(path), level_output_mse=False)
    model = model_for(template)
    cache = model.capture(capture_request(template, model)).to(torch.float16)
    exact = {key: cache.get(*key) for key in cache.k}
    requests = profile_edit_requests(template, model)[:MAX_REQUESTS]
    return enc, measure_output_weights(model, requests, exact, enc, file_reader(path), targets=(),
                                       per_level=False).reuse_mse  # (no anchors: the reuse runs only)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("packs", type=Path)
    ap.add_argument("templates", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("| template | shard | priced (step error × weight) | measured (mean over requests) | measured / priced |")
    print("|---|---|---|---|---|")
    for tid in a.templates:
        enc, reuse = measured_reuse(a.packs, tid)
        ratios = []
        for u, measured in zip(enc.units, reuse):
            if measured is None:
                continue
            priced = enc.step_error(u) * u.weight
            ratios.append(measured / priced if priced > 0 else float("nan"))
            print(f"| {tid} | {u.index} | {priced:.3g} | {measured:.3g} | {ratios[-1]:.2f} |")
        print(f"| {tid} | geometric mean | | | {float(np.exp(np.nanmean(np.log(ratios)))):.2f} |")


if __name__ == "__main__":
    main()
