#!/usr/bin/env bash
# The integer-dot decode matvec beside the exact f32 one and ggml's, in one
# run (docs/benchmarks.md "Integer-dot decode matvec"): L2-resident kernel
# rows (ops_bench MatvecL2 / MatvecInt8L2 and the harness's `vecdot`), DRAM
# rows against the read probe, then kvq bench tg32 with and without
# --exact-matvec and llama-bench tg32, alternated per model. Run it under the
# shared bench lock:
#   flock /work/logs/bench.lock nice -n -10 bench/int8_decode_ab.sh
# Needs: make build (kvq, ops_bench) and the llama.cpp build of scripts/build_llama_cpp.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
llama_bin=$(scripts/build_llama_cpp.sh llama llama-bench | tail -n 1)
load() { uptime | sed 's/.*load/load/'; }
echo "== start $(date -u +%H:%M:%S) $(load)"
build/bin/ops_bench --benchmark_filter='^(MatvecL2|MatvecInt8L2)/' --benchmark_min_time=0.2
echo "== ggml vecdot $(load)"
"$llama_bin/kvq-llamacpp-harness" vecdot
echo "== DRAM rows $(load)"
build/bin/ops_bench --benchmark_min_time=0.3 \
  --benchmark_filter='^(Matvec|MatvecInt8)/(q8_0|q4_1|q5_0|q4_k|q6_k)/(896x4864|4864x896)/threads:1'
for round in 1 2; do
  models="qwen2.5-coder-1.5b-instruct.gguf qwen2.5-coder-0.5b-instruct.gguf SmolLM2-135M-Instruct.Q4_1.gguf"
  [ "$round" = 2 ] && models=qwen2.5-coder-1.5b-instruct.gguf
  for m in $models; do
    M=.deps/models/$m
    echo "== round $round $m integer $(load)"
    build/bin/kvq bench -m "$M" -t 2 -p 0 -n 32 -r 3
    echo "== round $round $m exact $(load)"
    build/bin/kvq bench -m "$M" -t 2 -p 0 -n 32 -r 3 --exact-matvec
    echo "== round $round $m llama.cpp $(load)"
    "$llama_bin/llama-bench" -m "$M" -t 2 -fa 1 -p 0 -n 32 -r 3
  done
done
echo "== end $(date -u +%H:%M:%S) $(load)"
