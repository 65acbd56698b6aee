#!/usr/bin/env bash
# Issue 4's GPU paths on a GPU machine that has no Docker engine (the device):
#   1. `compileq demo` on its embedded default (private redis-server, one GPU-pinned worker);
#   2. the exact commands docker-compose.yml's `gpu` profile runs (and deploy/k8s, deploy/slurm
#      run: tests/test_deploy_manifests.py keeps them equal): `compileq worker --gpus all
#      --metrics-port 9808`, then the trainer-gpu command twice, the second as a new machine
#      (empty local cache dirs), then `compileq stats`, `compileq doctor` and a metrics scrape.
#   source .carry/device-setup.sh && bash docker/gpu-profile-native.sh
# Needs redis-server on PATH and a Redis at 127.0.0.1:6379 for step 2 (device-setup.sh gives both).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CQ=(python3 -m compileq.cli)

echo "== compileq demo (no COMPILEQ_REDIS_URL: embedded default)"
(unset COMPILEQ_REDIS_URL COMPILEQ_BROKER_URL; timeout 300 "${CQ[@]}" demo) 2>&1 | tee "$OUT/demo.txt"
echo "demo exit: ${PIPESTATUS[0]}"

echo "== compose gpu profile, natively"
export COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0 COMPILEQ_SECRET=gpu-profile-secret
redis-cli flushall >/dev/null
"${CQ[@]}" worker --gpus all --metrics-port 9808 > "$OUT/gpu-worker.log" 2>&1 &
WORKER=$!
for _ in $(seq 120); do redis-cli --scan --pattern 'compileq:workers:*' | grep -q . && break; sleep 1; done
WORK=$(mktemp -d)
for machine in first second; do
  echo "-- trainer-gpu on the $machine machine"
  TORCHINDUCTOR_CACHE_DIR=$WORK/$machine/inductor TRITON_CACHE_DIR=$WORK/$machine/triton \
    timeout 240 "${CQ[@]}" run -- python3 examples/train_step.py --steps 3 2>"$OUT/trainer-$machine.err" | tail -1
  echo "exit: ${PIPESTATUS[0]}; stats:"
  "${CQ[@]}" stats --json | tail -1 | tee "$OUT/stats-$machine.json"
done
"${CQ[@]}" doctor 2>&1 | tail -20
python3 - <<'PY'
import urllib.request
body = urllib.request.urlopen("http://127.0.0.1:9808/metrics", timeout=10).read().decode()
print("metrics:", [l for l in body.splitlines() if l.startswith("compileq_") and not l.startswith("compileq_build_seconds_bucket")][:12])
PY
kill -TERM $WORKER; wait $WORKER
tail -5 "$OUT/gpu-worker.log"
