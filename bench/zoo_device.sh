#!/bin/bash
# The GPU zoo in one device call: `bash bench/zoo_device.sh LANES SECONDS MODELS`, run on the
# device machine with .carry carried (../shared/device/README.md). Its torch has no .pyc files
# and sets PYTHONDONTWRITEBYTECODE: every fresh process would compile torch's, timm's and
# transformers' sources again, seconds of each run's first step that no user's machine pays.
# So one process imports them first (the compile stack, timm, each model's transformers
# module), writing their .pyc; then the zoo runs for SECONDS at most (SIGTERM: each lane keeps
# what it finished), and its results come back as $OUT/zoo.tgz (every lane's zoo.json and
# logs) beside the merged zoo.json and zoo.md.
set -u
lanes=$1 seconds=$2 models=$3
# Set up once per call: a second install into /tmp/site would replace files that a zoo beside
# this one is importing.
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) source .carry/device-setup.sh || exit 1 ;; esac
unset PYTHONDONTWRITEBYTECODE
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 - "$models" <<'PY'
import sys, time
started = time.time()
import torch._inductor.compile_fx  # noqa: F401
import timm  # noqa: F401  (registers every model: imports each of its modules)
import transformers
from bench.zoo_models import MODELS
listed = {m.name: m for m in MODELS}
for name in sys.argv[1].split(","):
    m = listed.get(name)
    arch = m.arch if m else name.partition(":")[2]
    if (m.suite if m else name.partition(":")[0]) == "hf" and hasattr(transformers, arch):
        getattr(transformers, arch)
print(f"zoo_device: imports warmed in {time.time() - started:.1f} s", flush=True)
PY
timeout -s TERM "$seconds" python3 -m bench zoo --size gpu --lanes "$lanes" --models "$models" --out /tmp/zoo
echo "zoo_device: zoo exited $?"
tar czf "$OUT/zoo.tgz" -C /tmp zoo
cp /tmp/zoo/zoo.json /tmp/zoo/zoo.md "$OUT/" 2>/dev/null
nvidia-smi --query-gpu=memory.used --format=csv,noheader
