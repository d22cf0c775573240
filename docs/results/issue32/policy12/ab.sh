#!/bin/bash
# The first-half A/B of this pass: ab.sh PACKS OUT TRACE [WORKLOADS] [STARTS], from the repository root.
# Run the two arms side by side (same code; packs without and with build.level_output_mse).
packs=$1; out=$2; trace=$3; wl=${4:-fs}; n=${5:-20}
cp docs/results/issue32/headline/calibration.json "$out.calibration.json"  # (a copy per process)
SAKURA_PACKS=$packs sakura bench --figure regret --trace ../shared/traces/$trace.csv --workloads $wl --systems sakura \
  --trace-part first --starts $n --regret-budget 5 --threads 1 --calibration "$out.calibration.json" --out "$out"
