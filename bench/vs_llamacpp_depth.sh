#!/usr/bin/env bash
# Side-by-side at depth: prefill and decode with DEPTH tokens already in the
# KV cache, kvq's paged caches against llama.cpp's (flash attention on), on the
# same `kvq synth --preset qwen2.5-0.5b` F16 GGUF, same threads, one run.
# Pairs: kvq f16 / llama.cpp f16, kvq int8 (g32, 9 bits/value) / llama.cpp
# q8_0 (8.5), kvq int4 (g32 asym, 5) / llama.cpp q4_0 (4.5).
# Also prints each decode figure as a fraction of its bandwidth floor:
# (weight bytes + KV bytes read per token) / read bandwidth of a probe run here.
#
#   bench/vs_llamacpp_depth.sh [THREADS] [REPETITIONS] [DEPTHS] [PROMPT] [GEN] [MODEL] [PAIRS]
# Defaults: 2 threads, 2 repetitions, depths 4096,16384, pp512, tg32, the
# synthetic model, pairs f16:f16,int8:q8_0,int4:q4_0 (kvq:llama.cpp). A real
# model: e.g. `bench/vs_llamacpp_depth.sh 2 3 0,4096 512 128
# .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf f16:f16` (issue 16's table).
# Needs: make build. Slow: each test refills DEPTH tokens first.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-2}
depths=${3:-4096,16384}
prompt=${4:-512}
gen=${5:-32}
kvq=build/bin/kvq
llama_bin=$(scripts/build_llama_cpp.sh llama llama-bench | tail -n 1)
synthetic=build/bench/qwen2.5-0.5b-f16.gguf
model=${6:-$synthetic}
pairs=${7:-f16:f16,int8:q8_0,int4:q4_0}
out=build/bench/depth/$(basename "$model" .gguf)
mkdir -p "$out"
if [ "$model" = "$synthetic" ] && [ ! -f "$model" ]; then
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
probe=$(build/bin/ops_bench --benchmark_filter="^ReadProbe/$threads/" --benchmark_format=json \
  2>/dev/null | /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
bench = json.loads(text[text.index("{"):])["benchmarks"][0]
print(bench["bytes_per_second"] / 1e9)')
echo "read probe, $threads threads: $probe GB/s"
for pair in ${pairs//,/ }; do
  set -- ${pair/:/ }
  echo "== llama.cpp -ctk $2 -ctv $2 -d $depths"
  "$llama_bin/llama-bench" -m "$model" -t "$threads" -fa 1 -ctk "$2" -ctv "$2" -d "$depths" \
    -p "$prompt" -n "$gen" -r "$reps" -o json > "$out/llama_$2.json"
  echo "== kvq --kv-cache-dtype $1 -d $depths"
  "$kvq" bench -m "$model" -t "$threads" --kv-cache-dtype "$1" -d "$depths" -p "$prompt" \
    -n "$gen" -r "$reps" > "$out/kvq_$1.md"
  "$kvq" plan -m "$model" --kv-cache-dtype "$1" --json > "$out/plan_$1.json"
done
/usr/bin/python3 bench/depth_table.py "$out" "$probe" "$model" "$pairs"
