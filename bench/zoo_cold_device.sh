#!/bin/bash
# True cold pairs on the device, four lanes at once: `LANE_A=MODELS LANE_B=... LANE_C=...
# LANE_D=... SECONDS=470 bash bench/zoo_cold_device.sh`, run on the device machine with .carry
# carried (../shared/device/README.md). Each lane is `python -m bench zoo --size gpu --runs
# stock_cold,compileq_cold` pinned to its 4 cores (0-3, 4-7, 8-11, 12-15) with a cluster of its
# own; the cold runs are only what changes between them (a second look restarts the worker:
# bench/harness.Cluster.wipe_worker_caches). The .pyc of torch, timm and transformers are
# written first (see zoo_device.sh), so no stock run pays for them. A lane left empty is not
# run; each lane stops at SECONDS (SIGTERM: it keeps what it finished), and the results come
# back as $OUT/cold.tgz and $OUT/cold.md, written before the call's own limit.
set -u
source .carry/device-setup.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
unset PYTHONDONTWRITEBYTECODE
python3 -c "
import torch._inductor.compile_fx, timm, transformers  # noqa: F401
print('imports warmed', flush=True)"
lane() {  # CPUS NAME MODELS
  [ -n "$3" ] || return 0
  taskset -c "$1" timeout -s TERM "${SECONDS_EACH:-470}" python3 -m bench zoo --size gpu \
    --models "$3" --runs stock_cold,compileq_cold --out "/tmp/cold/$2" > "$OUT/side-$2.log" 2>&1
}
lane 0-3 a "${LANE_A:-}" &
lane 4-7 b "${LANE_B:-}" &
lane 8-11 c "${LANE_C:-}" &
lane 12-15 d "${LANE_D:-}" &
wait
tar czf "$OUT/cold.tgz" -C /tmp cold 2>/dev/null
for d in /tmp/cold/*; do echo "== $d"; cat "$d/zoo.md"; done > "$OUT/cold.md" 2>&1
grep -E "^\| [a-zA-Z]" "$OUT/cold.md"
