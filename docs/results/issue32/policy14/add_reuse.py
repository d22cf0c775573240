"""Add each shard's measured reuse MSE (``build.reuse_output_mse``) to SAKURA packs priced before it, keeping their
weights and level table as they are (copies: the header is rewritten in place). What the A/B's second arm streamed.

    python docs/results/issue32/policy14/add_reuse.py PACKS TEMPLATE …
"""

import argparse
from pathlib import Path

import torch

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.formats import FORMATS
from sakura.offline.builder import capture_request, profile_edit_requests
from sakura.offline.level_errors import file_reader
from sakura.offline.output_weights import MAX_REQUESTS, OutputWeights, measure_output_weights, store_output_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("packs", type=Path)
    ap.add_argument("templates", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(1)
    fmt = FORMATS["sakura"]
    for tid in a.templates:
        template = load_catalog().get(tid)
        path = a.packs / f"{tid}.pack"
        enc = fmt.encoding_cls(fmt.open(path), level_output_mse=False)
        weights, local, table = enc.output_weights(), enc.local_output_mse(), enc.level_output_mse()
        model = model_for(template)
        cache = model.capture(capture_request(template, model)).to(torch.float16)
        exact = {key: cache.get(*key) for key in cache.k}
        requests = profile_edit_requests(template, model)[:MAX_REQUESTS]
        reuse = measure_output_weights(model, requests, exact, enc, file_reader(path), targets=(),
                                       per_level=False).reuse_mse  # (no anchors: the reuse runs only)
        store_output_weights(path, OutputWeights(tuple(weights), local, tuple(map(tuple, table)), reuse))
        print(tid, [None if m is None else f"{m:.2g}" for m in reuse])


if __name__ == "__main__":
    main()
