#!/usr/bin/env bash
# kvq serve under load (issue 8's measurement), one KV cache type after
# another at the same --kv-memory: for each type, starts the server on a free
# loopback port, runs bench/serve_load.mjs at each concurrency level (bounded
# request count and time per level), stops the server with SIGTERM. Prints a
# row per (type, level) and, at the end, each type's throughput and latency
# against the first type (f16) of the same run.
#
#   bench/serve_bench.sh [options]
#     --model PATH          (default: build/bench/qwen2.5-0.5b-f16.gguf, made by kvq synth)
#     --dtypes LIST         (default: f16,int8,int4,kivi2; a type this kvq does not
#                            know is skipped with a message)
#     --kv-memory SIZE      (default: 160M: f16 holds ~4 sequences of 3K prompt + 256
#                            generated tokens on qwen2.5-0.5b, 12 KiB per token)
#     --concurrency LIST    (default: 1,8,32)
#     --requests N|auto|LIST per level (default: auto = max(8, 2 x concurrency); a
#                           list gives one count per --concurrency level: 2,8,32)
#     --seconds S           per level; requests still running then are aborted (default: 900)
#     --prompt-tokens N|A-B prompt lengths, uniform in A..B (default: 2048-4096)
#     --max-tokens N        generated per request (default: 256)
#     --max-num-seqs N      (default: 32)
#     --threads N           (default: 2)
#     --shared-prefix N:T   N system prompts of T tokens shared by the requests (default: none)
#     --prefix-caching LIST on, off or on,off: runs each type with --enable-prefix-caching /
#                           --no-enable-prefix-caching (default: on); with both, each row is
#                           labelled TYPE/prefix-on or TYPE/prefix-off
#     --batch-invariant LIST off, on or off,on: runs each type without / with
#                           --batch-invariant (default: off); with both, rows are
#                           labelled TYPE/variable and TYPE/invariant
#     --results FILE        keep the JSON lines of every level (default: a temporary file)
#     --dry-run 1           only start each type's server and print what the budget
#                           admits (to choose --kv-memory); no load
# Needs: build/bin/kvq (make build), node >= 20. The full default table is
# long (every request prefills 2-4K tokens): run it on an otherwise idle
# machine. A quick check of the script itself:
#   bench/serve_bench.sh --model models/kvq-tiny-qwen2 --kv-memory 1M --concurrency 1,4 \
#     --requests 8 --seconds 120 --prompt-tokens 32-64 --max-tokens 16 --threads 1
# The shared-prefix mix (memory saved, throughput with and without sharing):
#   bench/serve_bench.sh --model .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf --dtypes f16 \
#     --shared-prefix 4:1024 --prompt-tokens 64-256 --prefix-caching on,off ...
set -euo pipefail
cd "$(dirname "$0")/.."
kvq=build/bin/kvq
default_model=build/bench/qwen2.5-0.5b-f16.gguf
model=$default_model
dtypes=f16,int8,int4,kivi2
memory=160M
concurrency=1,8,32
requests=auto
seconds=900
prompt_tokens=2048-4096
max_tokens=256
max_num_seqs=32
threads=2
results=
dry_run=0
shared_prefix=
prefix_modes=on
invariant_modes=off
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
    --results) results=$2 ;;
    --dry-run) dry_run=$2 ;;
    --shared-prefix) shared_prefix=$2 ;;
    --prefix-caching) prefix_modes=$2 ;;
    --batch-invariant) invariant_modes=$2 ;;
    *) echo "serve_bench: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x "$kvq" ] || { echo "serve_bench: build first (make build)" >&2; exit 1; }
command -v node > /dev/null || { echo "serve_bench: node (>= 20) is required" >&2; exit 1; }
if [ "$model" = "$default_model" ] && [ ! -f "$model" ]; then
  mkdir -p build/bench
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
prompt_min=${prompt_tokens%-*}
prompt_max=${prompt_tokens#*-}
vocab=$("$kvq" info "$model" 2>/dev/null | sed -n 's/^ *vocab[^0-9]*\([0-9][0-9]*\).*/\1/p' | head -n 1)
[ -n "$vocab" ] || { echo "serve_bench: cannot read the vocabulary size of $model (kvq info)" >&2; exit 1; }
shared_tokens=0
[ -z "$shared_prefix" ] || shared_tokens=${shared_prefix#*:}
max_model_len=$((prompt_max + shared_tokens + max_tokens))
mean_tokens=$(((prompt_min + prompt_max) / 2 + shared_tokens + max_tokens))
shared_flag=()
[ -z "$shared_prefix" ] || shared_flag=(--shared-prefix "$shared_prefix")
log_dir=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; fi
  rm -rf "$log_dir"
}
trap cleanup EXIT
[ -n "$results" ] || results=$log_dir/results.jsonl
: > "$results"

echo "kvq serve load: $model (vocab $vocab), --kv-memory $memory, prompts $prompt_tokens tokens," \
  "$max_tokens generated, requests per level $requests (at most $seconds s), max-num-seqs $max_num_seqs," \
  "$threads threads, $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
header=1
failed=0
baseline=
declare -a admitted=()
# Every (type, prefix mode, invariance) in turn; with both invariance modes,
# each type's two runs are adjacent, so their ratio is taken minutes apart.
for run in $(for d in ${dtypes//,/ }; do for m in ${prefix_modes//,/ }; do
  for i in ${invariant_modes//,/ }; do echo "$d,$m,$i"; done; done; done); do
  IFS=, read -r dtype mode invariant <<< "$run"
  label=$dtype
  [ "$prefix_modes" = on ] || label="$dtype/prefix-$mode"
  invariant_flag=
  [ "$invariant" = off ] || invariant_flag=--batch-invariant
  if [ "$invariant_modes" != off ]; then
    if [ "$invariant" = on ]; then label="$label/invariant"; else label="$label/variable"; fi
  fi
  prefix_flag=--enable-prefix-caching
  [ "$mode" = on ] || prefix_flag=--no-enable-prefix-caching
  # A type with f16 windows cannot share prefixes: let the default say so.
  if [ "$mode" = on ] && [ "$prefix_modes" = on ]; then prefix_flag=; fi
  out=$log_dir/${label//\//_}.out
  err=$log_dir/${label//\//_}.err
  "$kvq" serve -m "$model" --port 0 -t "$threads" --kv-cache-dtype "$dtype" --kv-memory "$memory" \
    --max-model-len "$max_model_len" --max-num-seqs "$max_num_seqs" --max-waiting 1024 \
    $prefix_flag $invariant_flag --served-model-name bench > "$out" 2> "$err" &
  server_pid=$!
  port=
  while :; do
    # (the server opens $out itself: until then there is nothing to read)
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out" 2>/dev/null || true)
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    wait "$server_pid" || true
    server_pid=
    if grep -q "KV cache type '$dtype'" "$err"; then
      echo "serve_bench: skipping $dtype: this kvq does not know that KV cache type: $(tail -n 1 "$err")" >&2
    else
      echo "serve_bench: the server did not start for $dtype:" >&2
      cat "$err" >&2
      failed=1
    fi
    continue
  fi
  # "KV cache <type>: B blocks of T tokens (M MiB)": how many sequences of the
  # mean length fit, to show what the budget admits for each type.
  # (streaming types name K and V: "KV cache k:int2-c32.../v:...: B blocks"; the
  # server also prints the blocks each sequence takes for its f16 windows.)
  cache_line=$(grep -o 'KV cache .*: [0-9]* blocks of [0-9]* tokens ([0-9.]* MiB)' "$err" || true)
  blocks=$(echo "$cache_line" | sed -n 's/.*: \([0-9]*\) blocks of \([0-9]*\) tokens.*/\1/p')
  block_tokens=$(echo "$cache_line" | sed -n 's/.*: \([0-9]*\) blocks of \([0-9]*\) tokens.*/\2/p')
  staging=$(sed -n 's/.* \([0-9]*\) blocks per sequence for f16 windows.*/\1/p' "$err" | head -n 1)
  staging=${staging:-0}
  if [ -n "$blocks" ]; then
    per_sequence=$(((mean_tokens + block_tokens - 1) / block_tokens + staging))
    admitted+=("$dtype: $cache_line, $staging blocks per sequence for f16 windows -> $((blocks / per_sequence)) sequences of $mean_tokens tokens")
  fi
  [ -n "$baseline" ] || baseline=$label
  if [ "$dry_run" = 1 ]; then
    kill -TERM "$server_pid"
    wait "$server_pid" || failed=1
    server_pid=
    continue
  fi
  header_flag=()
  [ $header = 1 ] || header_flag=(--no-header)
  node bench/serve_load.mjs --url "http://127.0.0.1:$port" --model bench --label "$label" \
    --concurrency "$concurrency" --requests "$requests" --seconds "$seconds" \
    --prompt-tokens "$prompt_tokens" --max-tokens "$max_tokens" --vocab "$vocab" \
    "${shared_flag[@]}" --json "$results" "${header_flag[@]}" || failed=1
  header=0
  kill -TERM "$server_pid"
  wait "$server_pid" || { echo "serve_bench: the $label server did not exit cleanly" >&2; failed=1; }
  server_pid=
done

if [ ${#admitted[@]} -gt 0 ]; then
  echo
  echo "KV budget $memory per type:"
  printf '  %s\n' "${admitted[@]}"
fi
if [ -s "$results" ]; then
  node bench/serve_load.mjs --summarize "$results" --baseline "$baseline"
fi
exit $failed
