"""One masked run of a template's first profiling request, timed over 10 runs with torch's threads as the
environment sets them. Two copies side by side are two builds' pricing on the two cores:

    python docs/results/issue32/policy18/threads_timing.py a & python docs/results/issue32/policy18/threads_timing.py b
    OMP_NUM_THREADS=1 python …/threads_timing.py a & OMP_NUM_THREADS=1 python …/threads_timing.py b
"""

import sys
import time

import torch

from sakura.catalog import load_catalog
from sakura.editing import edit_request, model_for
from sakura.offline.builder import capture_request

tpl = load_catalog().get("fs-astronaut")
model = model_for(tpl, None)
cache = model.capture(capture_request(tpl, model))
exact = {key: cache.get(*key) for key in cache.k}
req = edit_request(tpl, tpl.profile_requests[0], resolution=model.codec.resolution, ref_size=model.codec.ref_size)
model.masked_edit(req, lambda s, layer: exact[(s, layer)])  # (warm-up)
t = time.perf_counter()
for _ in range(10):
    model.masked_edit(req, lambda s, layer: exact[(s, layer)])
print(f"{sys.argv[1:]}: {torch.get_num_threads()} threads, {(time.perf_counter() - t) / 10 * 1e3:.0f} ms per run")
