#!/usr/bin/env bash
# Issue #32 item 5: the README's table on the measured traces (held-out second halves, paper regime, 20 offsets per
# workload, every system against its clairvoyant optimum). Two processes, one torch thread each, one trace pair each;
# the calibration is measured first on the quiet machine (`--calibration` below) and replayed by both.
# Usage: docs/results/issue32/headline/sweep.sh OUT_DIR [STARTS] [REGRET_BUDGET_S]
# (a calibration.json already in OUT_DIR is replayed as it is: the before/after runs of a change share one; it keeps
# one section per machine fingerprint, and `replay_calibration.py OUT_DIR/calibration.json` copies the AMD EPYC one,
# measured in session 19, for this machine: without it another machine measures its own)
set -euo pipefail
out=${1:?OUT_DIR}; starts=${2:-20}; budget=${3:-5}
cd "$(dirname "$0")/../../../.."
traces=../shared/traces
run() {  # trace names, one after the other (5g-synthetic: the synthetic 5G profile, fs only)
  for name in "$@"; do
    if [ "$name" = 5g-synthetic ]; then spec=(--trace 5g --workloads fs); else spec=(--trace "$traces/$name.csv"); fi
    .venv/bin/sakura bench --figure regret "${spec[@]}" --trace-part second --starts "$starts" \
      --regret-budget "$budget" --threads 1 --calibration "$out/calibration.json" --out "$out/$name" \
      > "$out/$name.log" 2>&1
  done
}
mkdir -p "$out"
# packs (the default folder: $SAKURA_PACKS, else packs/ in the checkout) are built beforehand (two processes of
# `sakura build --threads 1`); calibrate every template alone, on a quiet machine
.venv/bin/sakura bench --figure 12 --systems local --starts 1 --trace "$traces/5g-walking-603s.csv" --threads 1 \
  --calibration "$out/calibration.json" --out "$out/calibrate" > "$out/calibrate.log" 2>&1
run 5g-walking-603s 5g-driving-236s &
run 4g-driving-250s 4g5g-mixed-600s 5g-synthetic &
wait
