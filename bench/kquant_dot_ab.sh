#!/usr/bin/env bash
# The K-quant integer dot (Q2_K ... Q6_K weights against q8_K activations)
# of two kvq builds, and llama.cpp's decode beside them, alternated round
# by round on this machine (docs/benchmarks.md, "K-quant integer dot"):
#   OUT/builds: ops_bench's integer-dot kernels (L2-resident rows, and the
#               batched tile at 1 and 4 tokens) and `kvq bench` tg32 of
#               BASE_DIR's build against this tree's build;
#   OUT/llama:  the same `kvq bench` rows of this tree's build against
#               `llama-bench` on the same GGUF, threads and tokens;
#   OUT/raw.txt: every command's output, and ggml's own vec_dot on the
#               kernel's shape (the harness's `vecdot`).
#   bench/kquant_dot_ab.sh BASE_DIR OUT [ROUNDS] [THREADS]
# BASE_DIR is a build directory of the base revision holding bin/kvq and
# bin/ops_bench (e.g. a git worktree's build/). Tables:
#   bench/ab_rounds_table.py render OUT/builds   (and OUT/llama)
# Needs: make build and scripts/build_llama_cpp.sh's llama-bench and harness.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/kquant_dot_ab.sh BASE_DIR OUT [ROUNDS] [THREADS]}
out=${2:?usage: bench/kquant_dot_ab.sh BASE_DIR OUT [ROUNDS] [THREADS]}
rounds=${3:-2}
threads=${4:-2}
llama_bin=$(scripts/build_llama_cpp.sh llama llama-bench | tail -n 1)
models=".deps/models/qwen2.5-coder-1.5b-instruct.gguf .deps/models/qwen2.5-coder-0.5b-instruct.gguf"
kernels='^((MatvecL2|MatvecInt8L2)/(q2_k|q3_k|q4_k|q5_k|q6_k|q8_0)|MatvecInt8Batch/(q4_k|q6_k)/1536x1536/n:(1|4))$'
mkdir -p "$out/builds" "$out/llama"
echo "main kdot" > "$out/builds/ab-labels.txt"
echo "llama.cpp kdot" > "$out/llama/ab-labels.txt"
raw=$out/raw.txt
note() { echo "== $* $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" | tee -a "$raw"; }

# kvq bench's markdown rows for every model (the label's build).
kvq_rows() {
  local kvq=$1 file=$2
  : > "$file"
  for m in $models; do
    "$kvq" bench -m "$m" -t "$threads" -p 0 -n 32 -r 3 | tee -a "$raw" | grep '| tg32 |' >> "$file"
  done
}
# llama-bench's rows rewritten in kvq bench's columns (model path, backend,
# cache type), so that both tables name the same benchmark.
llama_rows() {
  local file=$1
  : > "$file"
  for m in $models; do
    "$llama_bin/llama-bench" -m "$m" -t "$threads" -fa 1 -p 0 -n 32 -r 3 -o md | tee -a "$raw" |
      awk -F'|' -v m="$m" '$8 ~ /tg32/ {
        gsub(/^ +| +$/, "", $3); gsub(/^ +| +$/, "", $4); gsub(/^ +| +$/, "", $6); gsub(/^ +| +$/, "", $9)
        printf "| llama.cpp %s | %s | %s | llama.cpp CPU | %s | f16 | tg32 | %s |\n", m, $3, $4, $6, $9
      }' >> "$file"
  done
}

note "start: base $base, $rounds rounds, $threads threads"
for round in $(seq 1 "$rounds"); do
  for label in main kdot; do
    dir=build
    [ "$label" = main ] && dir=$base
    note "round $round $label kernels"
    "$dir/bin/ops_bench" --benchmark_filter="$kernels" --benchmark_min_time=0.3 \
      --benchmark_format=json > "$out/builds/$label-$round.json" 2>> "$raw"
    note "round $round $label kvq bench"
    kvq_rows "$dir/bin/kvq" "$out/builds/$label-$round.bench.md"
  done
  cp "$out/builds/kdot-$round.bench.md" "$out/llama/kdot-$round.bench.md"
  note "round $round llama-bench"
  llama_rows "$out/llama/llama.cpp-$round.bench.md"
  note "round $round ggml vecdot"
  "$llama_bin/kvq-llamacpp-harness" vecdot >> "$raw" 2>&1
done
note "end"
