#!/usr/bin/env bash
# Issue-2 check on a GPU node: one worker pinned to GPU 0, a training step under stock
# torch.compile and under compileq (cold, then a new machine with empty local caches),
# `compileq warm` twice, and the hit-path benchmark. Results land in $OUT.
#   source .carry/device-setup.sh && bash bench/device_foundation.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0 COMPILEQ_SECRET=device-check-secret
export COMPILEQ_HEARTBEAT_INTERVAL_S=1
STEP_ARGS=${STEP_ARGS:---layers 4 --d 512 --seq 256 --batch 8 --steps 3}
py() { python3 "$@"; }
fresh() { local d; d=$(mktemp -d); echo "TORCHINDUCTOR_CACHE_DIR=$d/inductor TRITON_CACHE_DIR=$d/triton"; }
stats() { py -m compileq.cli stats --json 2>/dev/null | tail -1; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
py -m compileq.cli worker --gpus 0 --concurrency 8 > "$OUT/worker.log" 2>&1 &
WORKER=$!
for _ in $(seq 120); do redis-cli --scan --pattern 'compileq:workers:*' | grep -q . && break; sleep 1; done
redis-cli --scan --pattern 'compileq:workers:*' | tee "$OUT/queues.txt"

echo "== stock cold" | tee -a "$OUT/summary.txt"
env $(fresh) python3 examples/train_step.py $STEP_ARGS 2>"$OUT/stock.err" | tail -1 | tee "$OUT/stock.json" | tee -a "$OUT/summary.txt"
echo "== compileq cold" | tee -a "$OUT/summary.txt"
env $(fresh) python3 examples/train_step.py --compileq $STEP_ARGS 2>"$OUT/cq_cold.err" | tail -1 | tee "$OUT/cq_cold.json" | tee -a "$OUT/summary.txt"
stats | tee "$OUT/stats_after_cold.json" | tee -a "$OUT/summary.txt"
echo "== compileq new machine" | tee -a "$OUT/summary.txt"
env $(fresh) python3 examples/train_step.py --compileq $STEP_ARGS 2>"$OUT/cq_new.err" | tail -1 | tee "$OUT/cq_new.json" | tee -a "$OUT/summary.txt"
stats | tee "$OUT/stats_after_new.json" | tee -a "$OUT/summary.txt"
echo "== warm x2 (dynamic_mlp fixture)" | tee -a "$OUT/summary.txt"
env $(fresh) python3 -m compileq.cli warm tests/fixtures/dynamic_mlp.jsonl --json 2>>"$OUT/warm.err" | tail -1 | tee -a "$OUT/summary.txt"
env $(fresh) python3 -m compileq.cli warm tests/fixtures/dynamic_mlp.jsonl --json 2>>"$OUT/warm.err" | tail -1 | tee -a "$OUT/summary.txt"

python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
load = lambda n: json.load(open(f"{out}/{n}"))
stock, cold, new = load("stock.json"), load("cq_cold.json"), load("cq_new.json")
s1, s2 = load("stats_after_cold.json"), load("stats_after_new.json")
print("losses equal to stock:", stock["loss"] == cold["loss"] == new["loss"], stock["loss"], cold["loss"], new["loss"])
print("cold run: remote compiles", s1["kernel_remote_compiles"], "local compiles", s1["kernel_local_compiles"])
print("new machine: hits +", s2["kernel_hits"] - s1["kernel_hits"], "misses +", s2["kernel_misses"] - s1["kernel_misses"],
      "compiles +", s2["kernel_remote_compiles"] + s2["kernel_local_compiles"] - s1["kernel_remote_compiles"] - s1["kernel_local_compiles"])
print("first step s: stock %.2f, compileq cold %.2f, compileq new machine %.2f" % (stock["first_step_s"], cold["first_step_s"], new["first_step_s"]))
PY
echo "== hit path" | tee -a "$OUT/summary.txt"
COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/5 python3 -m bench.hit_path --reps 20 2>"$OUT/hit_path.err" | tee -a "$OUT/summary.txt"
kill -TERM $WORKER; wait $WORKER
grep -c "built" "$OUT/worker.log" | sed 's/^/worker build log lines: /' | tee -a "$OUT/summary.txt"
