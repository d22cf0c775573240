"""One calibration file for a before/after comparison on a busy machine (issue #34).

    python docs/results/issue34/freeze_calibration.py FILE TEMPLATE_ID... [--runs 3]

`sakura bench` refuses to store a compute profile whose local-generation runs are more than 10 % apart (a
loaded machine), so two bench runs would each measure their own and replay different compute. A frozen
comparison needs one profile both runs read: this measures each template's compute the way the bench does
and stores it even when it is wide, marked ``frozen_for_comparison`` (with its spread and load), so that it is
never mistaken for the machine's calibration in a result about speed. Results that use it say so.
"""

from __future__ import annotations

import argparse

import torch

from sakura.catalog import load_catalog
from sakura.editing import model_for
from sakura.kvcache import shard_plan
from sakura.offline.builder import DEFAULT_SHARD_SIZE
from sakura.runtime.calibration import CalibrationStore


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("templates", nargs="+")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    store = CalibrationStore(args.file, full_repeats=args.runs)
    catalog = load_catalog()
    for tid in args.templates:
        tpl = catalog.get(tid)
        model = model_for(tpl)
        shards = shard_plan(model.num_steps, model.num_layers, DEFAULT_SHARD_SIZE)
        if store.get(model, tpl, shards) is not None:
            print(f"{tid}: already in {args.file}")
            continue
        store.measure(model, tpl, shards)
        for key, entry in list(store._refused.items()):  # (this script's one purpose: keep it anyway)
            store._profiles[key] = {**entry, "frozen_for_comparison": entry.pop("refused")}
        store._refused.clear()
        store._save()
        print(f"{tid}: stored in {args.file}")


if __name__ == "__main__":
    main()
