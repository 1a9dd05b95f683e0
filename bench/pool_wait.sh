#!/usr/bin/env bash
# Decode speed of kvq's thread pool by polling time, on an idle machine and
# with one core busy, beside an OpenMP build of kvq (the baseline) in the
# same run. Usage: bench/pool_wait.sh KVQ OPENMP_KVQ OUT_LOG [ROUNDS]
#   KVQ         a kvq with the pool (--poll-us)
#   OPENMP_KVQ  a kvq from before the pool (libgomp's waits; settings from
#               GOMP_SPINCOUNT), e.g. a build of 6089e5f
# 'busy' runs a one-thread spin loop beside kvq for the whole measurement
# (bench/busy_core.sh).
set -euo pipefail
source "$(dirname "$0")/busy_core.sh"
kvq=$1 omp_kvq=$2 out=$3 rounds=${4:-3}
model=.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
args=(generate -m "$model" --chat -p "What is a KV cache?" -n 48 --kv-cache-dtype kivi2 -t 2)
pp=(bench -m "$model" -p 512 -n 0 -r 3 -t 2)
# Each run is cut off after 300 s (OpenMP's default waits under load can
# take minutes); a cut-off run prints nothing after the label.
decode() { timeout 300 "$@" 2>&1 | grep -o 'decode:.*' || true; }
prefill() { timeout 300 "$@" 2>&1 | grep -E '^\|' | tail -1 | awk -F'|' '{print $8 $9}' || true; }
run_all() {  # $1 = idle|busy
  for r in $(seq 1 "$rounds"); do
    echo "$1 round $r openmp default:        $(decode "$omp_kvq" "${args[@]}")"
    echo "$1 round $r openmp SPINCOUNT=1000: $(GOMP_SPINCOUNT=1000 decode "$omp_kvq" "${args[@]}")"
    for p in 0 10 50 200 1000; do
      echo "$1 round $r pool --poll-us $p:    $(decode "$kvq" "${args[@]}" --poll-us "$p")"
    done
    echo "$1 round $r openmp default:        $(prefill "$omp_kvq" "${pp[@]}")"
    echo "$1 round $r openmp SPINCOUNT=1000: $(GOMP_SPINCOUNT=1000 prefill "$omp_kvq" "${pp[@]}")"
    for p in 0 50 1000; do
      echo "$1 round $r pool --poll-us $p:    $(prefill "$kvq" "${pp[@]}" --poll-us "$p")"
    done
  done
}
{
  echo "# $(date -u +%F), $(nproc)-core $(grep -m1 -o 'avx512f' /proc/cpuinfo || echo no-avx512) VM"
  echo "# decode: kvq ${args[*]}"
  echo "# prefill: kvq ${pp[*]} (t/s of pp512)"
  run_all idle
  start_busy_core
  run_all busy
  stop_busy_core
} | tee "$out"
