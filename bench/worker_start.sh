# Times `compileq worker` from the command to its first heartbeat, cold (no memo) and warm.
export COMPILEQ_SECRET=measuresecretxxxxxxxxxxxxxxxxxxxxx COMPILEQ_REDIS_URL=redis://127.0.0.1:6379/0
python3 -c "import time; t=time.time(); import torch; print('import torch %.1fs' % (time.time()-t))"
for run in "gpu-cold --gpus all" "gpu-warm --gpus all" "cpu-cold --cpu-only --arch sm_90"; do
  set -- $run; name=$1; shift
  case $name in *cold) rm -rf /tmp/xdg /tmp/wcache; redis-cli flushall >/dev/null;; esac
  start=$(date +%s.%N)
  XDG_CACHE_HOME=/tmp/xdg TORCHINDUCTOR_CACHE_DIR=/tmp/wcache setsid python3 -m compileq.cli worker "$@" --concurrency 4 > $OUT/worker-$name.log 2>&1 &
  pid=$!
  until [ -n "$(redis-cli --scan --pattern 'compileq:worker:*' | head -1)" ]; do sleep 0.2; done
  echo "$name: $(python3 -c "import time; print(round(time.time() - $start, 1))") s to the first heartbeat"
  sleep 8; grep -h "ready " $OUT/worker-$name.log | sed 's/.*compileq worker/worker/'
  kill -TERM $pid; sleep 6; pkill -9 -f compileq.workers.process; redis-cli --scan --pattern 'compileq:worker*' | xargs -r redis-cli del >/dev/null
done
