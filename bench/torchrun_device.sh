#!/usr/bin/env bash
# torchrun training configurations on the device, one after another: `CONFIGS="NAME:SECONDS:REPS:
# SCRIPT ARGS;..." bash bench/torchrun_device.sh`, run on the device machine with .carry carried
# (../shared/device/README.md). Each config is `python -m bench.ddp --reps REPS --runs
# stock_cold,stock_warm_local,compileq_cold,compileq_new -- SCRIPT ARGS` (RUNS replaces the
# runs; NPROC=N passes --nproc N), stopped at SECONDS (it keeps what it finished). bench.ddp
# itself puts a rank on every GPU and runs arguments that name no device on the GPUs
# (chosen_script_args), so the same configs run two ranks where two GPUs are lent. Results come back as
# $OUT/torchrun.tgz (each config's ddp.json and ddp.md) and their tables on stdout. The default
# CONFIGS are the thirty-seventh session's: FSDP2 over the whole model and per block, timm's
# ResNet, max-autotune. A config's arguments may begin with `--zoo MODEL` (bench.ddp's: a
# model of the zoo at its GPU size), the script's own following: "bert-ddp:240:1:--zoo
# BertForMaskedLM --bucket-mb 4". On one H100 such a config's four runs take 170-250 s
# (BertForMaskedLM's 165 s, the worker's start included): at 175 s each, three configs were
# cut short after their stock runs.
set -u
source .carry/device-setup.sh > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
# The device's torch ships without .pyc files and forbids writing them (zoo_device.sh).
unset PYTHONDONTWRITEBYTECODE
python3 -c "import torch._inductor.compile_fx, torch.distributed.fsdp, timm; print('imports warmed')"
DEFAULT="fsdp-whole:200:2:--width 512 --layers 8 --fsdp;fsdp-blocks:170:1:--width 512 --layers 8 --fsdp --compile-blocks;resnet:200:1:--model timm-resnet;autotune:330:1:--width 256 --layers 2 --mode max-autotune-no-cudagraphs"
IFS=';' read -ra configs <<< "${CONFIGS:-$DEFAULT}"
for c in "${configs[@]}"; do
  IFS=':' read -r name seconds reps args <<< "$c"
  zoo=()
  if [[ $args == "--zoo "* ]]; then read -r _ model args <<< "$args"; zoo=(--zoo "$model"); fi
  # shellcheck disable=SC2086  # the script's arguments are words on purpose
  timeout -s TERM "$seconds" python3 -m bench.ddp ${NPROC:+--nproc "$NPROC"} "${zoo[@]}" --reps "$reps" \
    --runs "${RUNS:-stock_cold,stock_warm_local,compileq_cold,compileq_new}" \
    --out "/tmp/torchrun/$name" -- $args > "$OUT/$name.log" 2>&1
  echo "== $name rc=$?"; head -9 "/tmp/torchrun/$name/ddp.md" 2>/dev/null
done
tar czf "$OUT/torchrun.tgz" --exclude "*.log" -C /tmp torchrun
