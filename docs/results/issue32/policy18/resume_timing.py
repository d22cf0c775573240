"""How long one output-weight measurement run takes when it starts at its shard's step (``masked_edit(resume=…)``)
against the whole run, per step, on a template's profiling request (one torch thread, interleaved repeats).

    python docs/results/issue32/policy18/resume_timing.py fs-astronaut --repeats 7
"""

import argparse
import time

import numpy as np
import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.offline.builder import capture_request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("template")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tpl = load_catalog().get(a.template)
    model = model_for(tpl, None)
    cache = model.capture(capture_request(tpl, model))
    exact = {key: cache.get(*key) for key in cache.k}
    req = edit_request(tpl, tpl.profile_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
    provider = lambda s, layer: exact[(s, layer)]  # noqa: E731
    states: dict = {}
    whole = model.masked_edit(req, provider, trajectory=states).image
    times: dict = {s: [] for s in [None, *range(model.num_steps)]}
    for _ in range(a.repeats):
        for step in times:
            t = time.perf_counter()
            out = model.masked_edit(req, provider, resume=None if step is None else (step, states[step])).image
            times[step].append(time.perf_counter() - t)
            assert np.array_equal(out, whole)
    full = np.median(times[None])
    print(f"{a.template}: whole run {full * 1e3:.0f} ms (median of {a.repeats})")
    for step in range(model.num_steps):
        print(f"  from step {step}: {np.median(times[step]) / full:.2f} of it")
    mean = np.mean([np.median(times[s]) for s in range(model.num_steps)]) / full
    print(f"  a measurement's runs (shards spread evenly over the steps): {mean:.2f} of the whole runs' time")


if __name__ == "__main__":
    main()
