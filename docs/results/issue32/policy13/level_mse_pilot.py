"""Pilot: every SAKURA level's output masked MSE (one shard at the level, rest exact) on each of the template's
profiling requests (kept per request). python level_mse_pilot.py TEMPLATE OUT.json CALIBRATION.json
(reads the packs in /work/packs: edit the path)."""
import sys, json, time
from pathlib import Path
import torch; torch.set_num_threads(1)
import numpy as np
from sakura.eval import bench as B
from sakura.catalog import load_catalog
from sakura.runtime.calibration import CalibrationStore
from sakura.offline.builder import profile_edit_requests
from sakura.offline.output_weights import masked_mse
from sakura.formats import file_id
from sakura.net.refs import resolving
from tqdm import tqdm

tid, out = sys.argv[1], sys.argv[2]
tpl = load_catalog().get(tid)
prepared = B.prepare_template(tpl, Path("/work/packs"), calibration=CalibrationStore(Path(sys.argv[3])))
model = prepared.model
requests = profile_edit_requests(tpl, model)[:3]
exact = prepared.fp16_kv
enc0 = prepared.runtime.encoding(prepared.state, "sakura")
fid = file_id(tid, "sakura")
source = resolving(prepared.runtime.source, fid, enc0)
read = lambda ranges: source.fetch_timed(fid, ranges).parts
refs = [model.masked_edit(r, lambda s, l: exact[(s, l)]).image for r in requests]
res = {"template": tid, "requests": len(requests), "units": {}}
t0 = time.time()
total = sum(len(u.levels) for u in enc0.units)
bar = tqdm(total=total)
for unit in enc0.units:
    per = {}
    for k, lv0 in enumerate(unit.levels):
        enc = enc0.fresh()
        priced = enc.priced(unit)
        lv = priced.levels[k]
        kv = {**exact, **enc.decode(priced, lv, read(enc.ranges(priced, lv)))}
        per[lv0.label] = {"error": lv0.error, "mse": [masked_mse(model.masked_edit(r, lambda s, l: kv[(s, l)]).image, ref, r.mask) for r, ref in zip(requests, refs)]}
        bar.update(1)
    res["units"][str(unit.index)] = {"weight": unit.weight, "levels": per}
    Path(out).write_text(json.dumps(res))
res["seconds"] = time.time() - t0
Path(out).write_text(json.dumps(res))
