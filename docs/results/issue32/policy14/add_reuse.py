"""Add each shard's measured reuse MSE (``build.reuse_output_mse``) to SAKURA packs priced before it, keeping their
weights and level table as they are (copies: the header is rewritten in place). What the A/B's second arm streamed.

    python docs/results/issue32/policy14/add_reuse.py PACKS TEMPLATE …
"""

import argparse
from pathlib import Path

import torch
from reuse_price import measured_reuse  # (this folder)

from sakura.offline.output_weights import OutputWeights, store_output_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("packs", type=Path)
    ap.add_argument("templates", nargs="+")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for tid in a.templates:
        enc, reuse = measured_reuse(a.packs, tid)
        table = tuple(map(tuple, enc.level_output_mse()))
        store_output_weights(a.packs / f"{tid}.pack", OutputWeights(tuple(enc.output_weights()),
                                                                    enc.local_output_mse(), table, reuse))
        print(tid, [None if m is None else f"{m:.2g}" for m in reuse])


if __name__ == "__main__":
    main()
