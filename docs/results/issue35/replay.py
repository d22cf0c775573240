"""Replay a kernel-link bench run on the simulated clock, each edit with the compute it really did (its record's
``compute``) over the link as the device reads a kernel-shaped one (``--sim-link kernel``): what is left between the
two is the link model. The run's own config (its summary.json) gives the offsets, templates and calibration.

    sakura bench --clock real --link kernel … --out RUN          # (root)
    python docs/results/issue35/replay.py RUN OUT
"""

import json
import sys
from dataclasses import fields
from pathlib import Path

import torch

from sakura.eval.bench import BenchConfig, use_rebuild_clock
from sakura.eval.realclock import replay_kernel_runs


def config_of(run: Path) -> BenchConfig:
    saved = json.loads((run / "summary.json").read_text())["config"]
    kw = {}
    for f in fields(BenchConfig):
        if f.name in saved:
            v = saved[f.name]
            kw[f.name] = tuple(v) if isinstance(v, list) else (Path(v) if f.name in ("packs", "calibration_file")
                                                                 and v and "://" not in v else v)
    use_rebuild_clock(saved.get("rebuild_clock", "cpu"))
    return BenchConfig(**kw)


if __name__ == "__main__":
    torch.set_num_threads(1)
    run, out = Path(sys.argv[1]), Path(sys.argv[2])
    replay_kernel_runs(config_of(run), run, out)
    print(f"wrote {out}")
