"""The link table (links.md) from the bench runs of the same offsets: simulated (fluid), simulated (TCP's view of
outages), simulated with the host's compute (rebuilds on the executor's core) on the paced link and as the device
reads the kernel-shaped one, each kernel edit replayed at its own compute, device-paced, kernel-shaped — e.g. the
simulated runs redone after a change to the simulated clock, beside the real-clock runs of the sweep
(`links_sweep.sh`). Each run: a bench output folder or a records file (.jsonl or .jsonl.gz).

    python docs/results/issue35/relink.py --sim RUN [--sim-tcp RUN] [--sim-host RUN] [--sim-kernel RUN] \
        [--sim-replay RUN] [--paced RUN] --kernel RUN [--out links.md]
"""

import argparse
from pathlib import Path

from sakura.eval.plots import load_records
from sakura.eval.realclock import LINK_RUNS, link_check, link_table


def main() -> None:
    ap = argparse.ArgumentParser()
    for run in LINK_RUNS:
        ap.add_argument(f"--{run}", type=Path, required=run in ("sim", "kernel"))
    ap.add_argument("--out", type=Path)
    a = vars(ap.parse_args())
    given = {run: a[run.replace("-", "_")] for run in LINK_RUNS if a[run.replace("-", "_")] is not None}
    table = link_table(link_check({run: load_records(path) for run, path in given.items()}))
    print(table)
    if a["out"]:
        a["out"].write_text(table + "\n")


if __name__ == "__main__":
    main()
