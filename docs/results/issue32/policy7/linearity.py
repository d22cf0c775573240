"""Is a shard's output cost linear in the pack's error? Per shard of a built SAKURA pack: the levels whose stored
error is nearest each target, each alone in an otherwise exact cache, and the edit's masked MSE per unit of error
(mean over the template's profiling requests, with the range over them) — what
:mod:`sakura.offline.output_weights` summarises as one weight per shard (issue #32, session 27).

    python docs/results/issue32/policy7/linearity.py vton-grace-hopper 0.1,0.01,0.001,0.0001 [--packs DIR]
"""

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.formats import FORMATS
from sakura.offline.builder import capture_request
from sakura.offline.level_errors import file_reader
from sakura.offline.output_weights import anchor_levels, masked_mse
from sakura.places import default_packs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("targets", help="stored errors, comma-separated")
    ap.add_argument("--packs", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tpl = load_catalog().get(a.template)
    model = model_for(tpl, None)
    cache = model.capture(capture_request(tpl, model)).to(torch.float16)
    exact = {key: cache.get(*key) for key in cache.k}
    requests = [edit_request(tpl, r, resolution=model.codec.resolution, ref_size=model.codec.ref_size)
                for r in tpl.profile_requests]
    refs = [model.masked_edit(r, lambda s, layer: exact[(s, layer)]).image for r in requests]
    path = Path(a.packs or default_packs()) / f"{FORMATS['sakura'].file_id(tpl.id)}.pack"
    fmt = FORMATS["sakura"]
    enc, read = fmt.encoding_cls(fmt.open(path)), file_reader(path)
    t0 = time.perf_counter()
    print(f"{tpl.id}: {len(requests)} profiling requests; per shard: level, stored error, masked MSE / error "
          "(mean over requests, range); the stored weight")
    for unit in enc.units:
        cells = []
        for lv in anchor_levels(unit.levels, tuple(float(x) for x in a.targets.split(","))):
            kv = {**exact, **enc.fresh().decode(unit, lv, read(enc.ranges(unit, lv)))}
            ratios = [masked_mse(model.masked_edit(r, lambda s, layer: kv[(s, layer)]).image, ref, r.mask) / lv.error
                      for r, ref in zip(requests, refs)]
            cells.append(f"{lv.label.split('/')[0]} e={lv.error:.4f} {np.mean(ratios):.2e} "
                         f"({min(ratios):.1e}–{max(ratios):.1e})")
        print(f"shard {unit.index:2d}: " + " | ".join(cells) + f" | weight {unit.weight:.2e}", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
