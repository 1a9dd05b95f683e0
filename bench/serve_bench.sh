#!/usr/bin/env bash
# kvq serve under load, one KV cache type after another at the same
# --kv-memory: starts the server on a free loopback port, runs
# bench/serve_load.mjs at each concurrency, stops the server with SIGTERM.
#
#   bench/serve_bench.sh [options]
#     --model PATH          (default: build/bench/qwen2.5-0.5b-f16.gguf, made by kvq synth)
#     --dtypes LIST         (default: f16,int8,int4)
#     --kv-memory SIZE      (default: 256M)
#     --concurrency LIST    (default: 1,8,32)
#     --requests N          per concurrency level (default: 32)
#     --seconds S           per concurrency level (default: 300)
#     --prompt-tokens N     (default: 2048)
#     --max-tokens N        (default: 64)
#     --max-num-seqs N      (default: 32)
#     --threads N           (default: 2)
# Needs: make build (build/bin/kvq), node >= 20.
set -euo pipefail
cd "$(dirname "$0")/.."
kvq=build/bin/kvq
model=build/bench/qwen2.5-0.5b-f16.gguf
dtypes=f16,int8,int4
memory=256M
concurrency=1,8,32
requests=32
seconds=300
prompt_tokens=2048
max_tokens=64
max_num_seqs=32
threads=2
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2 ;;
    --dtypes) dtypes=$2 ;;
    --kv-memory) memory=$2 ;;
    --concurrency) concurrency=$2 ;;
    --requests) requests=$2 ;;
    --seconds) seconds=$2 ;;
    --prompt-tokens) prompt_tokens=$2 ;;
    --max-tokens) max_tokens=$2 ;;
    --max-num-seqs) max_num_seqs=$2 ;;
    --threads) threads=$2 ;;
    *) echo "serve_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x "$kvq" ] || { echo "serve_bench: build first (make build)" >&2; exit 1; }
if [ "$model" = build/bench/qwen2.5-0.5b-f16.gguf ] && [ ! -f "$model" ]; then
  mkdir -p build/bench
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
vocab=$("$kvq" info "$model" 2>/dev/null | sed -n 's/.*vocab[^0-9]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
vocab=${vocab:-8192}
max_model_len=$((prompt_tokens + max_tokens))
log_dir=$(mktemp -d)
trap 'rm -rf "$log_dir"' EXIT

echo "kvq serve load: $model, --kv-memory $memory, prompts $prompt_tokens tokens, $max_tokens generated," \
  "max-num-seqs $max_num_seqs, $threads threads, $(nproc) cores"
first=1
for dtype in ${dtypes//,/ }; do
  "$kvq" serve -m "$model" --port 0 -t "$threads" --kv-cache-dtype "$dtype" --kv-memory "$memory" \
    --max-model-len "$max_model_len" --max-num-seqs "$max_num_seqs" --max-waiting 1024 \
    --served-model-name bench > "$log_dir/$dtype.out" 2> "$log_dir/$dtype.err" &
  pid=$!
  port=
  for _ in $(seq 1 600); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log_dir/$dtype.out")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$log_dir/$dtype.err" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "serve_bench: server did not start" >&2; kill "$pid"; exit 1; }
  grep 'KV cache' "$log_dir/$dtype.err" >&2 || true
  node bench/serve_load.mjs --url "http://127.0.0.1:$port" --model bench --label "$dtype" \
    --concurrency "$concurrency" --requests "$requests" --seconds "$seconds" \
    --prompt-tokens "$prompt_tokens" --max-tokens "$max_tokens" --vocab "$vocab" \
    | if [ $first = 1 ]; then cat; else tail -n +3; fi
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^kvq_(num_preemptions_total|kv_blocks_total) ' >&2 || true
  kill -TERM "$pid"
  wait "$pid"
  first=0
done
