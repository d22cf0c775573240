#!/usr/bin/env bash
# Issue #35 item 2 at equal compute: each trace's kernel-link run (records keep what every edit executed), then
# its replay on the simulated clock with that compute (replay.py). One process; root.
# Usage: docs/results/issue35/replay_sweep.sh OUT_DIR CALIBRATION [STARTS] [TRACES…]
set -euo pipefail
out=${1:?OUT_DIR}; cal=${2:?CALIBRATION}; starts=${3:-20}; shift 3 || true
traces=("$@"); [ ${#traces[@]} -gt 0 ] || traces=(4g-driving-250s 5g-walking-603s)
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
for name in "${traces[@]}"; do
  .venv/bin/sakura bench --clock real --link kernel --workloads fs,vton,mb --systems sakura,intq,cachegen,fp16 \
    --trace "../shared/traces/$name.csv" --starts "$starts" --threads 1 --calibration "$cal" \
    --out "$out/$name/kernel" > "$out/$name.log" 2>&1
  .venv/bin/python docs/results/issue35/replay.py "$out/$name/kernel" "$out/$name/sim-replay" >> "$out/$name.log" 2>&1
done
