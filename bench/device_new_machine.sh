#!/usr/bin/env bash
# GPU: first training step (examples/train_step.py) in fresh processes, side by side: stock cold,
# stock warm local, stock's own Redis remote caches on a new machine, compileq cold (one GPU
# worker), compileq on a new machine (`compileq run`, empty local caches).
#   source .carry/device-setup.sh && bash bench/device_new_machine.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0 COMPILEQ_SECRET=device-secret COMPILEQ_HEARTBEAT_INTERVAL_S=1
STEP=${STEP:-examples/train_step.py --layers 4 --d 512 --seq 256 --batch 8 --steps 3}
WORK=$(mktemp -d)
redis-cli flushall >/dev/null
python3 -m compileq.cli worker --gpus 0 --concurrency 8 > "$OUT/worker.log" 2>&1 &
WORKER=$!
for _ in $(seq 120); do redis-cli --scan --pattern 'compileq:workers:*' | grep -q . && break; sleep 1; done
run() {  # $1 label, $2 cache dir, rest: command prefix
  local label=$1 dir=$WORK/$2; shift 2
  TORCHINDUCTOR_CACHE_DIR=$dir/inductor TRITON_CACHE_DIR=$dir/triton "$@" python3 $STEP 2>"$OUT/$label.err" | tail -1 > "$OUT/$label.json"
  echo "$label $(cat "$OUT/$label.json")"
}
REMOTE=(env TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1 TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1 TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE=1 TORCHINDUCTOR_REDIS_HOST=127.0.0.1 TORCHINDUCTOR_REDIS_PORT=6379)
run stock_cold s1 env
run stock_warm s1 env
run stock_remote_fill r1 "${REMOTE[@]}"
run stock_remote_new r2 "${REMOTE[@]}"
run cq_cold c1 python3 -m compileq.cli run --
python3 -m compileq.cli stats --json | tail -1 > "$OUT/stats_cold.json"
run cq_new c2 python3 -m compileq.cli run --
python3 -m compileq.cli stats --json | tail -1 > "$OUT/stats_new.json"
kill -TERM $WORKER; wait $WORKER
python3 - "$OUT" <<'PY' | tee "$OUT/device_new_machine.md"
import json, sys
out = sys.argv[1]
rows = ["stock_cold", "stock_warm", "stock_remote_fill", "stock_remote_new", "cq_cold", "cq_new"]
r = {n: json.load(open(f"{out}/{n}.json")) for n in rows}
base = r["stock_cold"]["first_step_s"]
print("| run (fresh process) | first step (s) | vs stock cold | losses equal stock |\n|---|---|---|---|")
for n in rows:
    print(f"| {n} | {r[n]['first_step_s']:.2f} | {r[n]['first_step_s']/base:.2f}x | {r[n]['loss'] == r['stock_cold']['loss']} |")
print(f"\ncompileq new machine / stock remote new machine: {r['cq_new']['first_step_s']/r['stock_remote_new']['first_step_s']:.2f}x")
c, n = json.load(open(f"{out}/stats_cold.json")), json.load(open(f"{out}/stats_new.json"))
delta = {k: n[k] - c[k] for k in c if isinstance(c[k], int) and n[k] != c[k]}
print("cold run counters:", {k: v for k, v in c.items() if v})
print("new machine counter deltas:", delta)
PY
grep -h "compileq" "$OUT"/cq_*.err | sort | uniq -c | head
