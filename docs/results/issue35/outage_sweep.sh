#!/usr/bin/env bash
# Issue #35 item 2: the edits a link model is judged on — every edit starts up to 1 s before one of the trace's
# dead stretches (`--trace-part outages`), on the four links (simulated fluid / TCP's view, paced, kernel-shaped).
# Usage: docs/results/issue35/outage_sweep.sh OUT_DIR CALIBRATION [STARTS] [TRACE] [SYSTEMS]   (root)
set -euo pipefail
out=${1:?OUT_DIR}; cal=${2:?CALIBRATION}; starts=${3:-12}; name=${4:-5g-walking-603s}; systems=${5:-sakura,cachegen}
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
.venv/bin/sakura bench --clock both --link kernel --trace-part outages --workloads fs,vton,mb --systems "$systems" \
  --trace "../shared/traces/$name.csv" --starts "$starts" --threads 1 --calibration "$cal" --out "$out/$name" \
  > "$out/$name.log" 2>&1
