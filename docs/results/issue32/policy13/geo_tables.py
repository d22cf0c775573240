"""Write a per-level table from a pilot JSON (``level_mse_pilot.py``: 3 requests per level) into a pack's header,
as the geometric mean over the requests (a fresh file, not a hard link), and check the pilot's arithmetic mean
against the table the build wrote. python geo_tables.py PILOT.json PACK"""
import sys, json, shutil, os
from pathlib import Path
import numpy as np
from sakura.formats import FORMATS
from sakura.offline.output_weights import OutputWeights, store_output_weights

lm = json.load(open(sys.argv[1])); pack = Path(sys.argv[2])
tmp = pack.with_suffix(".tmp"); shutil.copy(pack, tmp); os.replace(tmp, pack)  # break the hard link
fmt = FORMATS["sakura"]
enc = fmt.encoding_cls(fmt.open(pack), level_output_mse=False)
arith = enc.level_output_mse()
table = []
for u in enc.units:
    per = lm["units"][str(u.index)]["levels"]
    assert list(per) == [lv.label for lv in u.levels], u.index
    table.append(tuple(float(np.exp(np.mean(np.log(per[lv.label]["mse"])))) if min(per[lv.label]["mse"]) > 0 else 0.0
                       for lv in u.levels))
# sanity: the pilot's arithmetic mean matches the product's table
a = np.array([m for row in arith for m in row]); b = np.array([float(np.mean(per["mse"])) for u in enc.units
     for per in lm["units"][str(u.index)]["levels"].values()])
ok = (a > 0) & (b > 0)
print(pack.name, "pilot mean / product table: median", np.median(b[ok] / a[ok]), "max dev", np.max(np.abs(b[ok] / a[ok] - 1)))
store_output_weights(pack, OutputWeights(tuple(enc.output_weights()), enc.local_output_mse(), tuple(table)))
