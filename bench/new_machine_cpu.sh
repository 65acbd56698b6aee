#!/usr/bin/env bash
# First call of a compiled CPU training step (tests/clients/train_cpu.py), each in a fresh
# process, side by side: stock cold, stock warm local cache, stock's own Redis remote caches
# on a new machine, compileq cold, compileq on a new machine. Needs redis-server on PATH.
#   bash bench/new_machine_cpu.sh            (prints a markdown table; also $OUT/new_machine_cpu.md)
set -euo pipefail
PY=${PY:-.venv/bin/python}
SCRIPT=tests/clients/train_cpu.py
PORT=$($PY -c 'from compileq.localstack import free_port; print(free_port())')
WORK=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes --dir "$WORK" --logfile "$WORK/redis.log"
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
first_call() {  # $1 = cache dir name, rest = command prefix
  local dir="$WORK/$1"; shift
  TORCHINDUCTOR_CACHE_DIR=$dir/inductor TRITON_CACHE_DIR=$dir/triton "$@" "$PY" "$SCRIPT" 2>/dev/null \
    | tail -1 | $PY -c 'import json,sys; r=json.loads(sys.stdin.read()); assert r["matches_eager"]; print(round(r["first_call_s"], 2))'
}
export COMPILEQ_REDIS_URL=redis://127.0.0.1:$PORT/0 COMPILEQ_SECRET=bench-secret
STOCK_REMOTE=(env TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1 TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1 TORCHINDUCTOR_REDIS_HOST=127.0.0.1 TORCHINDUCTOR_REDIS_PORT=$PORT)
stock_cold=$(first_call s1 env)
stock_warm=$(first_call s1 env)
remote_fill=$(first_call r1 "${STOCK_REMOTE[@]}")
stock_remote=$(first_call r2 "${STOCK_REMOTE[@]}")
cq_cold=$(first_call c1 .venv/bin/compileq run --)
cq_new=$(first_call c2 .venv/bin/compileq run --)
ratio() { $PY -c "print(f'{$1/$2:.2f}x')"; }
TABLE="| run (fresh process) | first call (s) | vs stock cold |
|---|---|---|
| stock, cold | $stock_cold | 1.00x |
| stock, warm local cache | $stock_warm | $(ratio $stock_warm $stock_cold) |
| stock Redis remote cache, filling run | $remote_fill | $(ratio $remote_fill $stock_cold) |
| stock Redis remote cache, new machine | $stock_remote | $(ratio $stock_remote $stock_cold) |
| compileq, cold | $cq_cold | $(ratio $cq_cold $stock_cold) |
| compileq, new machine | $cq_new | $(ratio $cq_new $stock_cold) |

compileq new machine / stock Redis remote new machine: $(ratio $cq_new $stock_remote); compileq new machine / compileq cold: $(ratio $cq_new $cq_cold)"
echo "$TABLE"
[ -n "${OUT:-}" ] && echo "$TABLE" > "$OUT/new_machine_cpu.md"
