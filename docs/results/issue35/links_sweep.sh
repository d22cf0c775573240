#!/usr/bin/env bash
# Issue #35 item 2: three links, one table — the simulated clock (fluid trace and TCP's view of outages), the
# device-paced link and the kernel-shaped one (tc in a network namespace; root), same offsets, paper regime.
# One process (the real-clock runs need the machine's cores for the server and the device), calibration replayed.
# Usage: docs/results/issue35/links_sweep.sh OUT_DIR CALIBRATION [STARTS] [TRACES…]
set -euo pipefail
out=${1:?OUT_DIR}; cal=${2:?CALIBRATION}; starts=${3:-20}; shift 3 || true
traces=("$@"); [ ${#traces[@]} -gt 0 ] || traces=(4g-driving-250s 5g-walking-603s)
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
for name in "${traces[@]}"; do
  .venv/bin/sakura bench --clock both --link kernel --workloads fs,vton,mb --systems sakura,intq,cachegen,fp16 \
    --trace "../shared/traces/$name.csv" --starts "$starts" --threads 1 --calibration "$cal" --out "$out/$name" \
    > "$out/$name.log" 2>&1
done
