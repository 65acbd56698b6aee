#!/usr/bin/env bash
# On a device with two GPUs: the GPU tests named in TESTS (pytest -k expression, or "none"),
# then `python -m bench matrix` over WORKLOADS x CONFIGS, each bounded so the call returns its
# logs. Results land in $OUT (matrix.json, matrix.md, logs tarred).
#   source .carry/device-setup.sh && TESTS=cuda_1_loads WORKLOADS=script CONFIGS=single,cuda1 \
#     BUDGET_S=480 bash bench/device_matrix.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The device's torch ships without .pyc files and forbids writing them: every process would
# compile ~2,000 sources again and every timing would carry it.
unset PYTHONDONTWRITEBYTECODE
python3 -c "import torch._inductor.compile_fx, torch._dynamo, torch.distributed.fsdp, transformers, timm" 2>/dev/null
python3 -c "import compileq.features, celery, redis" || exit 1
started=$(date +%s)
if [ "${TESTS:-none}" != none ]; then
  timeout "${TESTS_S:-240}" python3 -m pytest -q -x tests/test_gpu_ranks.py tests/test_gpu.py -k "$TESTS" \
    > "$OUT/tests.txt" 2>&1; echo "tests rc=$?" >> "$OUT/tests.txt"; tail -5 "$OUT/tests.txt"
fi
left=$(( ${BUDGET_S:-540} - ($(date +%s) - started) ))
if [ -n "${WORKLOADS:-}" ] && [ "$left" -gt 60 ]; then
  timeout "$left" python3 -m bench matrix --workloads "$WORKLOADS" --configs "$CONFIGS" \
    --out "$OUT/matrix" ${MATRIX_FLAGS:-} > "$OUT/matrix.txt" 2>&1; echo "matrix rc=$?" >> "$OUT/matrix.txt"
  tail -30 "$OUT/matrix.txt"
fi
tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude logs.tgz . 2>/dev/null
