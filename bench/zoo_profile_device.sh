#!/bin/bash
# GPU: where a zoo model's new machine spends its first step against stock's warm local cache.
# `bash bench/zoo_profile_device.sh CPUS SECONDS MODELS`, on the device machine with .carry
# carried (../shared/device/README.md), beside bench/zoo_device.sh on the other CPUs if wanted
# (`taskset -c 0-11 bash bench/zoo_device.sh 3 ...`). One zoo lane on CPUS (a taskset list:
# 4 of them is a 4-core lane as the zoo's), each model's stock cold and warm local runs and
# compileq's cold and new machine, the two warm ones under cProfile (`--cprofile`): profiled
# runs are slower than plain ones, so the times here are not the zoo's. Then, per model,
# bench.profile_report: what compileq's new machine spent longer in than stock's warm local,
# under the compile and under Inductor's load of a statically launchable kernel (the
# 0.4-0.6 s of `StaticAutotunerFuture.warm_precompile` new machines showed in the zoo). Out:
# $OUT/profile.txt, $OUT/zoo-profiled.tgz (the lane's zoo.json, logs and pstats).
set -u
cpus=$1 seconds=$2 models=$3
# Set up once per call: a second install into /tmp/site would replace files that a zoo beside
# this one is importing.
case ":${PYTHONPATH:-}:" in *:/tmp/site:*) ;; *) source .carry/device-setup.sh || exit 1 ;; esac
unset PYTHONDONTWRITEBYTECODE
out=/tmp/zoo-profiled
taskset -c "$cpus" timeout -s TERM "$seconds" python3 -m bench zoo --size gpu --once \
  --runs stock_cold,stock_warm_local,compileq_cold,compileq_new \
  --cprofile stock_warm_local,compileq_new --models "$models" --out "$out"
echo "zoo_profile_device: zoo exited $?"
names=recheck_autotune_cache,check_autotune_cache,precompile,_precompile_config,_make_launchers
names=$names,make_launcher,load_kernel,reload_cubin_path,compile,_get,get_many,fetch,get_file
names=$names,compile_module_from_src,benchmark_all_configs,wait,result,load_by_key_path
{
  python3 - <<'PY'
import inspect
from torch._inductor import codecache
from torch._inductor.runtime import triton_heuristics as th
for f in (codecache.StaticAutotunerFuture.result, th.CachingAutotuner.recheck_autotune_cache,
          th.CachingAutotuner.precompile, th.CachingAutotuner._make_launchers):
    print(inspect.getsource(f))
PY
  for stem in $(ls "$out/pstats" | sed -n 's/-compileq_new\.pstats$//p'); do
    new=$out/pstats/$stem-compileq_new.pstats warm=$out/pstats/$stem-stock_warm_local.pstats
    [ -f "$warm" ] || continue
    for root in call_user_compiler recheck_autotune_cache precompile; do
      echo "== $stem: compileq_new over stock_warm_local, under $root"
      python3 -m bench.profile_report "$new" "$warm" --root "$root" --top 30
    done
    python3 -m bench.profile_report --names "$names" "$warm" "$new"
  done
} > "$OUT/profile.txt" 2>&1
tar czf "$OUT/zoo-profiled.tgz" -C /tmp zoo-profiled
tail -5 "$OUT/profile.txt"
