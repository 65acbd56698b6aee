#!/usr/bin/env bash
# A fresh pool process's first graph against its later ones: one `compileq worker --cpu-only`
# with one pool process, then the script-defined Llama (examples/llama_script.py, one layer)
# cold at widths 64, 96 and 128 in turn (other kernels each time, so nothing is reused but the
# process), each a fresh client with its own Inductor cache. Prints the worker's codegen line
# for each graph (forward, backward per width). Needs redis-server on PATH.
#   bash bench/fresh_pool.sh            (the worker's log also in $OUT/fresh_pool.log)
#   DEVICE=cuda bash bench/fresh_pool.sh   (a GPU worker on GPU 0, the model on cuda:0)
set -euo pipefail
PY=${PY:-.venv/bin/python}
COMPILEQ=${COMPILEQ:-.venv/bin/compileq}
DEVICE=${DEVICE:-cpu}
if [ "$DEVICE" = cpu ]; then WORKER_ARGS=(--cpu-only --arch sm_90); else WORKER_ARGS=(--gpus 0); fi
PORT=$($PY -c 'from compileq.localstack import free_port; print(free_port())')
WORK=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --dir "$WORK" --logfile "$WORK/redis.log"
export COMPILEQ_REDIS_URL=redis://127.0.0.1:$PORT/0 COMPILEQ_BROKER_URL=redis://127.0.0.1:$PORT/1 COMPILEQ_SECRET=bench-secret
TORCHINDUCTOR_CACHE_DIR=$WORK/worker-inductor TRITON_CACHE_DIR=$WORK/worker-triton \
  $COMPILEQ worker "${WORKER_ARGS[@]}" --concurrency 1 > "$WORK/worker.log" 2>&1 &
SUPERVISOR=$!
trap 'kill -TERM $SUPERVISOR 2>/dev/null; wait $SUPERVISOR 2>/dev/null; redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
for _ in $(seq 180); do grep -q "joined" "$WORK/worker.log" && break; sleep 1; done
grep -o "ready .*" "$WORK/worker.log" | head -1
for width in 64 96 128; do
  TORCHINDUCTOR_CACHE_DIR=$WORK/client-$width TRITON_CACHE_DIR=$WORK/client-triton-$width \
    $COMPILEQ run -- "$PY" examples/llama_script.py --device "$DEVICE" --width $width \
    --layers 1 --steps 1 >/dev/null 2>&1
done
grep "generated graph" "$WORK/worker.log" | sed 's/.*generated graph compileq:a:fxcode:\([0-9a-f]\{8\}\)[0-9a-f]* in /\1 /' | cut -c1-140
if [ -n "${OUT:-}" ]; then cp "$WORK/worker.log" "$OUT/fresh_pool.log"; fi
