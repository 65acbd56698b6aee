#!/usr/bin/env bash
# GPU: Triton's driver start (it builds or loads its cuda_utils C module) in fresh processes,
# stock on an empty and a warm TRITON_CACHE_DIR, compileq on empty ones with the store cold
# and warm (inductor/triton_modules.py); then the one-process new-machine comparison.
#   source .carry/device-setup.sh && bash bench/device_triton_modules.sh [REPS]
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REPS=${1:-2}
# The device sets PYTHONDONTWRITEBYTECODE=1 and its torch ships no bytecode: every process would
# compile ~2,200 of torch's sources again (docs/BENCHMARKS.md). Written once here, before any
# measured run, for stock and compileq alike, as on a machine whose install wrote it.
unset PYTHONDONTWRITEBYTECODE
python3 -c "import torch._inductor.compile_fx, torch._dynamo, torch._functorch.aot_autograd"
export COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0 COMPILEQ_SECRET=device-secret-0123456789abcdef
{
  echo "== Python bytecode where torch is installed"
  python3 - <<'PY'
import glob, os, sys, torch
d = os.path.dirname(torch.__file__)
print("torch at", d, "writable:", os.access(d, os.W_OK), "dont_write_bytecode:",
      sys.flags.dont_write_bytecode, "pycache_prefix:", sys.pycache_prefix)
print("pyc in torch/_inductor/__pycache__:", len(glob.glob(d + "/_inductor/__pycache__/*.pyc")),
      "py in torch/_inductor:", len(glob.glob(d + "/_inductor/*.py")))
PY
  echo "== Triton driver start (seconds), fresh processes"
  redis-cli flushall >/dev/null
  probe() {  # label, TRITON_CACHE_DIR, 1 to install compileq first
    TRITON_CACHE_DIR=$2 python3 -c "
import time, torch
torch.cuda.init()
if $3:
    import compileq; assert compileq.install()
import triton
t = time.perf_counter()
from triton.runtime import driver
driver.active.utils
print('$1', round(time.perf_counter() - t, 3))"
  }
  S=$(mktemp -d); A=$(mktemp -d); B=$(mktemp -d)
  probe "stock, empty dir" "$S" 0
  probe "stock, warm dir" "$S" 0
  probe "compileq, empty dir, store cold" "$A" 1
  probe "compileq, empty dir, store warm" "$B" 1
  probe "compileq, warm dir" "$B" 1
  python3 -m compileq.cli stats --json | tail -1 | python3 -c "
import json, sys; c = json.load(sys.stdin)
print({k: v for k, v in c.items() if k.startswith('triton_module')})"
} > "$OUT/driver.txt" 2>&1
cat "$OUT/driver.txt"
redis-cli flushall >/dev/null
BO=$(mktemp -d)
python3 -m bench.ddp --nproc 0 --reps "$REPS" --out "$BO" \
  --runs stock_cold,stock_warm_local,stock_remote_fill,stock_remote_new,compileq_cold,compileq_new \
  > "$OUT/ddp.txt" 2>&1
cp "$BO/ddp.json" "$BO/ddp.md" "$OUT/" 2>/dev/null
tar -C "$BO" -czf "$OUT/logs.tgz" --exclude='*.json' --exclude='*.md' .
tail -32 "$OUT/ddp.txt"
