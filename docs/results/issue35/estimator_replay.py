"""Both robust-mpc rules on the same transfers (those recorded in trough-before.json): the estimate before each choice
with the prediction error counted whole (before) and capped at MAX_PREDICTION_ERROR (after).

    .venv/bin/python docs/results/issue35/estimator_replay.py docs/results/issue35/trough-before.json
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sakura.online import monitor as M  # noqa: E402

src = Path(sys.argv[1])
res = json.loads(src.read_text())
units = res["units"]


def trajectory(cap: float) -> list[float]:
    saved = M.MAX_PREDICTION_ERROR
    M.MAX_PREDICTION_ERROR = cap
    try:
        m, out = M.RuntimeMonitor(units[0]["estimate_mbps"] * 1e6), []
        for u in units:
            out.append(m.rate_bps / 1e6)
            m.record_transfer(u["nbytes"], 8 * u["nbytes"] / (u["measured_mbps"] * 1e6))
        return out
    finally:
        M.MAX_PREDICTION_ERROR = saved


before, after = trajectory(float("inf")), trajectory(1.0)
fig, ax = plt.subplots(figsize=(10, 4))
ch = res["tc_changes"]
end = max(u["t_last"] for u in units) + 0.2
ax.step([c[0] for c in ch] + [end], [c[1] for c in ch] + [ch[-1][1]], where="post", color="tab:orange", lw=2,
        label="shaped rate (tc)")
t = [u["t_request"] for u in units]
ax.plot(t, before, "D", color="tab:red", label="estimate, error counted whole (before)")
ax.plot(t, after, "o", mfc="none", color="tab:green", ms=9,
        label=f"estimate, error capped at {M.MAX_PREDICTION_ERROR:g} (after)")
ax.plot([u["t_last"] for u in units], [u["measured_mbps"] for u in units], "x", color="tab:blue",
        label="each transfer's bytes / active time")
ax.set_yscale("symlog", linthresh=0.1)
ax.set_xlabel("seconds since the edit started")
ax.set_ylabel("Mbit/s (symlog)")
ax.set_title("the same transfers, both rules (recorded on the kernel-shaped link)", fontsize=10)
ax.legend(fontsize=8, loc="lower left")
fig.tight_layout()
fig.savefig(src.with_name("trough-replay-before-after.png"), dpi=110)
print(json.dumps({"before": [round(x, 2) for x in before], "after": [round(x, 2) for x in after]}))
