# Times `compileq worker` from the command to its first heartbeat, cold (no memo) and warm.
# Device: source .carry/device-setup.sh && bash bench/worker_start.sh   (logs under $OUT)
# CONCURRENCY=N: N pool processes per worker (default: the worker's own, the node's cores).
export COMPILEQ_SECRET=measuresecretxxxxxxxxxxxxxxxxxxxxx COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0
# A deployment's pip writes bytecode at install; the device's carry kit does not (--no-compile),
# so compile it here once, or every first run would time Python compiling celery and compileq.
python3 -m compileall -q /tmp/site src >/dev/null 2>&1
python3 -c "import time; t=time.time(); import torch; print('import torch %.1fs' % (time.time()-t))"
python3 - <<'PY'
import time
from compileq.workers import gpus
for how, fn in (("nvidia-smi", gpus._from_nvidia_smi), ("torch (before)", gpus._from_torch)):
    t = time.time(); found = fn(); print(f"GPU listing by {how}: {time.time() - t:.2f}s {found}")
PY
for run in "gpu-cold --gpus all" "gpu-warm --gpus all" "cpu-cold --cpu-only --arch sm_90" "cpu-warm --cpu-only --arch sm_90"; do
  set -- $run; name=$1; shift
  case $name in *cold) rm -rf /tmp/xdg /tmp/wcache; redis-cli flushall >/dev/null;; esac
  start=$(date +%s.%N)
  XDG_CACHE_HOME=/tmp/xdg TORCHINDUCTOR_CACHE_DIR=/tmp/wcache setsid python3 -m compileq.cli worker "$@" ${CONCURRENCY:+--concurrency "$CONCURRENCY"} > $OUT/worker-$name.log 2>&1 &
  pid=$!
  n=0; until [ -n "$(redis-cli --scan --pattern 'compileq:worker:*' | head -1)" ] || [ $n -gt 1800 ]; do sleep 0.1; n=$((n+1)); done
  echo "$name: $(python3 -c "import time; print(round(time.time() - $start, 1))") s to the first heartbeat"
  # Then every queue: the CPU FX queues join once the ISA probes end (workers/late_fx.py).
  n=0; until grep -q "joined" $OUT/worker-$name.log || [ $n -gt 900 ]; do sleep 0.1; n=$((n+1)); done
  echo "$name: $(python3 -c "import time; print(round(time.time() - $start, 1))") s to every queue"
  grep -h "ready \|listed by\|joined" $OUT/worker-$name.log | sed 's/.*compileq worker/worker/'
  # Memory the worker's processes hold between them (PSS: shared pages counted once in all).
  pss=0; procs=0; for p in $(pgrep -f compileq.workers.process); do
    k=$(awk '/^Pss:/{print $2}' /proc/$p/smaps_rollup 2>/dev/null); pss=$((pss + ${k:-0})); procs=$((procs + 1))
  done
  echo "$name: PSS $((pss / 1024)) MiB over $procs worker processes"
  kill -TERM $pid; sleep 5; pkill -9 -f compileq.workers.process; redis-cli --scan --pattern 'compileq:worker*' | xargs -r redis-cli del >/dev/null
done
