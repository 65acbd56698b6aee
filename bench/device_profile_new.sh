#!/usr/bin/env bash
# GPU: where a new machine's first compile spends its time against a warm local cache.
# bench.ddp --nproc 0 --cprofile: stock and compileq runs under cProfile, then bench.profile_report
# on them. (Triton's driver start on empty and warm cache dirs: bench/device_triton_modules.sh.)
#   source .carry/device-setup.sh && bash bench/device_profile_new.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BO=$(mktemp -d)
python3 -m bench.ddp --nproc 0 --cprofile --out "$BO" \
  --runs stock_cold,stock_warm_local,stock_remote_fill,stock_remote_new,compileq_cold,compileq_new \
  > "$OUT/ddp.txt" 2>&1
cp "$BO/ddp.json" "$BO/ddp.md" "$OUT/" 2>/dev/null
{
  for pair in "compileq_new stock_warm_local" "stock_remote_new stock_warm_local" "compileq_new stock_remote_new"; do
    set -- $pair
    python3 -m bench.profile_report "$BO/$1-0.pstats" "$BO/$2-0.pstats" --top 40
    echo
  done
  python3 -m bench.profile_report --names _build,compile_module_from_src,_compile_so,load_with_key,try_load,inductor_load,_get,get_many,read_and_emit,load_cached_static_autotuners,_load_module_from_path,load_by_key_path,read_best,_lookup_graph,cache_hit_post_compile,post_compile \
    "$BO"/stock_warm_local-0.pstats "$BO"/stock_remote_new-0.pstats "$BO"/compileq_new-0.pstats "$BO"/compileq_cold-0.pstats
} > "$OUT/profile.txt" 2>&1
tar -C "$BO" -czf "$OUT/pstats-logs.tgz" --exclude='*.json' --exclude='*.md' .
tail -30 "$OUT/ddp.txt"
