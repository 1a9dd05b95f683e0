#!/usr/bin/env bash
# Side-by-side at depth: prefill and decode with DEPTH tokens already in the
# KV cache, kvq's paged caches against llama.cpp's (flash attention on), on the
# same `kvq synth --preset qwen2.5-0.5b` F16 GGUF, same threads, one run.
# Pairs: kvq f16 / llama.cpp f16, kvq int8 (g32, 9 bits/value) / llama.cpp
# q8_0 (8.5), kvq int4 (g32 asym, 5) / llama.cpp q4_0 (4.5).
# Also prints each decode figure as a fraction of its bandwidth floor:
# (weight bytes + KV bytes read per token) / read bandwidth of a probe run here.
#
#   bench/vs_llamacpp_depth.sh [THREADS] [REPETITIONS] [DEPTHS] [PROMPT] [GEN] [MODEL] [PAIRS] [CALIBRATION]
# Defaults: 2 threads, 2 repetitions, depths 4096,16384, pp512, tg32, the
# synthetic model, pairs f16:f16,int8:q8_0,int4:q4_0 (kvq:llama.cpp). A real
# model: e.g. `bench/vs_llamacpp_depth.sh 2 3 0,4096 512 128
# .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf f16:f16` (issue 16's table).
# Several kvq types may share one llama.cpp type (e.g. int4:q4_0,kivi2:q4_0):
# llama-bench runs once per llama.cpp type and run. CALIBRATION, when given, is
# a `kvq calibrate` file passed to every kvq command (KVQuant's kvquant2/3/4
# need it). A run writes into OUT/run-<start time>/ nothing else: a killed run
# is resumed by giving RESUME_DIR as the 9th argument (pairs whose files exist
# there are not measured again).
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
calibration=${8:-}
out=${9:-build/bench/depth/$(basename "$model" .gguf)/run-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$out"
echo "results: $out"
# What bench/depth_table.py render needs to rebuild the table from this folder alone.
[ -f "$out/run.json" ] || printf '{"model": "%s", "pairs": "%s", "threads": %s, "repetitions": %s, "depths": "%s", "prompt": %s, "gen": %s, "calibration": "%s", "started": "%s", "load": "%s", "command": "%s"}\n' \
  "$(basename "$model")" "$pairs" "$threads" "$reps" "$depths" "$prompt" "$gen" "$calibration" \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
  "bench/vs_llamacpp_depth.sh $threads $reps $depths $prompt $gen $model $pairs $calibration" > "$out/run.json"
calib_args=()
[ -z "$calibration" ] || calib_args=(--kv-calibration "$calibration")
if [ "$model" = "$synthetic" ] && [ ! -f "$model" ]; then
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
read_probe() {
  build/bin/ops_bench --benchmark_filter="^ReadProbe/$threads/" --benchmark_format=json \
    2>/dev/null | /usr/bin/python3 -c '
import json, sys
text = sys.stdin.read()
bench = json.loads(text[text.index("{"):])["benchmarks"][0]
print(bench["bytes_per_second"] / 1e9)'
}
# The probe runs before and after the pairs; the table's floor takes the faster
# of the two (the higher floor: a conservative kvq / floor).
read_probe >> "$out/probe.txt"
probe=$(tail -n 1 "$out/probe.txt")
echo "read probe, $threads threads: $probe GB/s"
for pair in ${pairs//,/ }; do
  set -- ${pair/:/ }
  if [ ! -s "$out/llama_$2.json" ]; then
    echo "== llama.cpp -ctk $2 -ctv $2 -d $depths ($(uptime | sed 's/.*load/load/'))"
    "$llama_bin/llama-bench" -m "$model" -t "$threads" -fa 1 -ctk "$2" -ctv "$2" -d "$depths" \
      -p "$prompt" -n "$gen" -r "$reps" -o json > "$out/llama_$2.json.tmp"
    mv "$out/llama_$2.json.tmp" "$out/llama_$2.json"
  fi
  if [ ! -s "$out/kvq_$1.md" ]; then
    echo "== kvq --kv-cache-dtype $1 -d $depths ($(uptime | sed 's/.*load/load/'))"
    "$kvq" bench -m "$model" -t "$threads" --kv-cache-dtype "$1" "${calib_args[@]}" -d "$depths" \
      -p "$prompt" -n "$gen" -r "$reps" > "$out/kvq_$1.md.tmp"
    mv "$out/kvq_$1.md.tmp" "$out/kvq_$1.md"
  fi
  "$kvq" plan -m "$model" --kv-cache-dtype "$1" "${calib_args[@]}" --json > "$out/plan_$1.json"
done
read_probe >> "$out/probe.txt"
probe=$(sort -g "$out/probe.txt" | tail -n 1)
echo "read probe, $threads threads, every measurement of this run: $(tr '\n' ' ' < "$out/probe.txt")GB/s"
/usr/bin/python3 bench/depth_table.py "$out" "$probe" "$model" "$pairs"
