#!/usr/bin/env bash
# Side-by-side load tests (issue #15): 32 and 64 clients, 1 vs 2 generator processes, 1 vs 2 server replicas,
# every configuration twice (the second round in reverse order, so drift in the machine's load hits both
# sides alike). Needs a store with published templates and the AWS_* variables pointing at it.
# Usage: docs/results/issue15/run_loadtest.sh s3://packs/demo > docs/results/issue15/loadtest.jsonl
set -euo pipefail
STORE=${1:?usage: $0 s3://bucket/prefix}
configs=()
for c in 32 64; do for r in 1 2; do for p in 1 2; do configs+=("$c $r $p"); done; done; done
run() {
  read -r c r p <<<"$1"
  cmd="sakura loadtest --clients $c --replicas $r --procs $p --store $STORE --json"
  out=$(${SAKURA:-sakura} loadtest --clients "$c" --replicas "$r" --procs "$p" --store "$STORE" --json)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["round"]=int(sys.argv[3]); d["command"]=sys.argv[2]; d["load1"]=float(open("/proc/loadavg").read().split()[0]); print(json.dumps(d))' "$out" "$cmd" "$2"
}
for cfg in "${configs[@]}"; do run "$cfg" 1; done
for ((i=${#configs[@]}-1; i>=0; i--)); do run "${configs[$i]}" 2; done
