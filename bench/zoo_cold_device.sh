#!/bin/bash
# True cold pairs on the device, four lanes at once: `LANE_A=MODELS LANE_B=... LANE_C=...
# LANE_D=... SECONDS_EACH=470 bash bench/zoo_cold_device.sh`, run on the device machine with
# .carry carried (../shared/device/README.md). Each lane is `python -m bench zoo --size gpu
# --runs stock_cold,compileq_cold` pinned to its 4 cores (0-3, 4-7, 8-11, 12-15) with a cluster
# of its own; the cold runs are only what changes between them (a second look restarts the
# worker: bench/harness.Cluster.wipe_worker_caches). ARGS_A .. ARGS_D add arguments to one
# lane's zoo (`--setting COMPILEQ_SPECULATE=0`, `--once`, other `--runs`), and REPEAT=N runs
# each lane's zoo N times one after another, each into a folder of its own (a1, a2, ...), so
# an A/B comparison gets its pairs from lanes that ran side by side. The .pyc of torch, timm
# and transformers are written first (see zoo_device.sh), so no stock run pays for them. A
# lane left empty is not run; each lane stops at SECONDS_EACH (SIGTERM: it keeps what it
# finished), and the results come back as $OUT/cold.tgz and $OUT/cold.md, written before the
# call's own limit.
set -u
source .carry/device-setup.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
unset PYTHONDONTWRITEBYTECODE
python3 -c "
import torch._inductor.compile_fx, timm, transformers  # noqa: F401
print('imports warmed', flush=True)"
lane() {  # CPUS NAME MODELS EXTRA-ARGS
  [ -n "$3" ] || return 0
  local deadline=$((SECONDS + ${SECONDS_EACH:-470})) i
  for i in $(seq "${REPEAT:-1}"); do
    local left=$((deadline - SECONDS))
    [ "$left" -gt 0 ] || break
    # shellcheck disable=SC2086  # the extra arguments are words on purpose
    taskset -c "$1" timeout -s TERM "$left" python3 -m bench zoo --size gpu \
      --models "$3" --runs stock_cold,compileq_cold $4 --out "/tmp/cold/$2$i" \
      >> "$OUT/side-$2.log" 2>&1
  done
}
lane 0-3 a "${LANE_A:-}" "${ARGS_A:-}" &
lane 4-7 b "${LANE_B:-}" "${ARGS_B:-}" &
lane 8-11 c "${LANE_C:-}" "${ARGS_C:-}" &
lane 12-15 d "${LANE_D:-}" "${ARGS_D:-}" &
wait
tar czf "$OUT/cold.tgz" -C /tmp cold 2>/dev/null
for d in /tmp/cold/*; do echo "== $d"; cat "$d/zoo.md"; done > "$OUT/cold.md" 2>&1
grep -E "^(==|\| [a-zA-Z])" "$OUT/cold.md"
