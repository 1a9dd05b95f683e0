#!/usr/bin/env bash
# Serving throughput at equal KV memory against a real peer (issue 20, item 3):
# `kvq serve` and llama.cpp's `llama-server` (built from the same bundled
# source: scripts/build_llama_cpp.sh --server) on the same GGUF, the same KV
# budget and the same client (bench/serve_load.mjs), with one fixed, seeded
# mix of requests: prompts drawn uniformly from --prompt-tokens, windows of
# the held-out text (token ids from `kvq tokenize`, sent as ids to both
# servers, so both see exactly the same prompts), outputs drawn uniformly
# from --max-tokens (EOS ignored), at each concurrency level.
#
# The KV budget is the same bytes for every server:
#   llama-server: -c = budget / (f16 bytes per token); continuous batching
#     (-cb), flash attention on, -np slots of ctx / np tokens each, as many
#     as fit a whole request (prompt_max + output_max tokens); its host prompt
#     cache (--cache-ram) is off, since that is memory outside the budget.
#   kvq serve: --kv-memory budget; blocks are admitted by their exact bytes,
#     so a quantized cache holds more sequences in the same bytes.
#
# One cell = (server, concurrency): the server is started for the cell,
# driven, and stopped; the cell's result (serve_load's JSON line plus the
# server's peak RSS, VmHWM, and the load average before and after) goes to
# OUT/SERVER-cC.json, the server log's error lines to
# OUT/SERVER-cC.server-errors.log. A cell whose file exists is skipped, so an interrupted
# run resumes where it stopped. Cells run concurrency-major, the servers of
# one level one after another, so every ratio compares neighbours in time.
# With --lock FILE each cell runs under `flock FILE` (the shared bench lock).
#
#   bench/serve_vs_llamacpp.sh [options]
#     --model PATH        (default .deps/models/SmolLM2-135M-Instruct.Q4_1.gguf)
#     --servers LIST      (default llama-f16,kvq-f16,kvq-int4,kvq-kivi2; llama-TYPE uses
#                          -ctk/-ctv TYPE, kvq-TYPE --kv-cache-dtype TYPE)
#     --kv-memory MIB     KV budget in MiB (default 256)
#     --concurrency LIST  (default 1,4,16,64)
#     --requests LIST     one count per level, or one for all (default 4,8,32,64)
#     --prompt-tokens A-B (default 256-2048)   --max-tokens A-B (default 64-512)
#     --seconds S         per cell; requests still running are aborted (default 900)
#     --threads N         (default 2)          --seed N (default 1)
#     --out DIR           (default build/bench/serve_vs_llamacpp)
#     --lock FILE         run each cell under flock FILE
#     --kvq PATH          the kvq binary (default build/bin/kvq)
#     --table-only 1      only print the table of the cells in OUT
# Needs: make build, node >= 20, scripts/build_llama_cpp.sh --server.
set -euo pipefail
cd "$(dirname "$0")/.."
kvq=build/bin/kvq
model=.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
servers=llama-f16,kvq-f16,kvq-int4,kvq-kivi2
budget_mib=256
concurrency=1,4,16,64
requests=4,8,32,64
prompt_tokens=256-2048
max_tokens=64-512
seconds=900
threads=2
seed=1
out=build/bench/serve_vs_llamacpp
lock=
table_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2 ;;
    --servers) servers=$2 ;;
    --kv-memory) budget_mib=$2 ;;
    --concurrency) concurrency=$2 ;;
    --requests) requests=$2 ;;
    --prompt-tokens) prompt_tokens=$2 ;;
    --max-tokens) max_tokens=$2 ;;
    --seconds) seconds=$2 ;;
    --threads) threads=$2 ;;
    --seed) seed=$2 ;;
    --out) out=$2 ;;
    --lock) lock=$2 ;;
    --kvq) kvq=$2 ;;
    --table-only) table_only=$2 ;;
    *) echo "serve_vs_llamacpp: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
mkdir -p "$out"
if [ "$table_only" = 1 ]; then
  node bench/serve_vs_llamacpp_table.mjs "$out"
  exit 0
fi
[ -x "$kvq" ] || { echo "serve_vs_llamacpp: build first (make build)" >&2; exit 1; }
command -v node > /dev/null || { echo "serve_vs_llamacpp: node (>= 20) is required" >&2; exit 1; }
[ -f "$model" ] || { echo "serve_vs_llamacpp: no model $model (scripts/setup.sh)" >&2; exit 1; }
llama_bin=
if [[ ",$servers," == *",llama-"* ]]; then
  llama_bin=$(scripts/build_llama_cpp.sh --server | tail -n 1)
  [ -x "$llama_bin/llama-server" ] || { echo "serve_vs_llamacpp: no llama-server" >&2; exit 1; }
fi

prompt_max=${prompt_tokens#*-}
out_max=${max_tokens#*-}
max_len=$((prompt_max + out_max))
# f16 K+V bytes per token of every layer ("KV cache f16: 23040 bytes/token").
f16_token_bytes=$("$kvq" info "$model" 2>/dev/null | sed -n 's/^KV cache f16: *\([0-9]*\) bytes\/token.*/\1/p')
[ -n "$f16_token_bytes" ] || { echo "serve_vs_llamacpp: cannot read the f16 KV bytes per token (kvq info)" >&2; exit 1; }
budget_bytes=$((budget_mib * 1048576))
llama_ctx=$((budget_bytes / f16_token_bytes))
llama_slots=$((llama_ctx / max_len))
[ "$llama_slots" -ge 1 ] || { echo "serve_vs_llamacpp: $budget_mib MiB holds no whole request for llama-server" >&2; exit 1; }
llama_ctx=$((llama_slots * max_len))  # what the slots use; <= the budget

corpus_ids=$out/corpus.ids
if [ ! -s "$corpus_ids" ]; then
  "$kvq" tokenize "$model" - --ids-only < .deps/corpus/test.txt > "$corpus_ids.tmp"
  mv "$corpus_ids.tmp" "$corpus_ids"
fi

IFS=, read -r -a levels <<< "$concurrency"
IFS=, read -r -a counts <<< "$requests"
IFS=, read -r -a server_list <<< "$servers"
if [ ${#counts[@]} -ne 1 ] && [ ${#counts[@]} -ne ${#levels[@]} ]; then
  echo "serve_vs_llamacpp: --requests needs one count or one per level" >&2
  exit 2
fi
cat > "$out/setup.txt" <<EOF
model $model, KV budget $budget_mib MiB ($f16_token_bytes f16 bytes per token: llama-server -c $llama_ctx -np $llama_slots), prompts $prompt_tokens tokens of .deps/corpus/test.txt, outputs $max_tokens tokens, seed $seed, $threads threads, $(nproc) cores
EOF
echo "serve_vs_llamacpp: $(cat "$out/setup.txt")"

log_dir=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill -TERM "$server_pid" 2>/dev/null || true; fi
  rm -rf "$log_dir"
}
trap cleanup EXIT

free_port() {
  node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# Starts the server of cell $1 and sets server_pid and port, or fails.
start_server() {
  local name=$1 type=${1#*-} log=$log_dir/$1.log
  port=$(free_port)
  case "$name" in
    llama-*)
      "$llama_bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" \
        -tb "$threads" -c "$llama_ctx" -np "$llama_slots" --no-kv-unified -ctk "$type" \
        -ctv "$type" -fa on -cb --cache-ram 0 --no-webui --metrics --alias bench > "$log" 2>&1 &
      ;;
    kvq-*)
      "$kvq" serve -m "$model" --port "$port" -t "$threads" --kv-cache-dtype "$type" \
        --kv-memory "${budget_mib}M" --max-model-len "$max_len" --max-num-seqs 64 \
        --max-waiting 1024 --served-model-name bench > "$log" 2>&1 &
      ;;
    *) echo "serve_vs_llamacpp: unknown server $name" >&2; return 1 ;;
  esac
  server_pid=$!
  for _ in $(seq 1 600); do
    if curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.2
  done
  echo "serve_vs_llamacpp: $name did not start:" >&2
  tail -n 20 "$log" >&2
  return 1
}

run_cell() {
  local name=$1 level=$2 count=$3 file=$4
  local load_before load_after rss
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  start_server "$name"
  grep -h 'KV cache\|n_ctx\|n_slots' "$log_dir/$name.log" | head -n 3 | sed 's/^/  /' || true
  node bench/serve_load.mjs --url "http://127.0.0.1:$port" --model bench --label "$name" \
    --concurrency "$level" --requests "$count" --seconds "$seconds" \
    --prompt-tokens "$prompt_tokens" --max-tokens "$max_tokens" --corpus-ids "$corpus_ids" \
    --seed "$seed" --json "$log_dir/cell.json" --no-header
  rss=$(awk '/^VmHWM/ {print $2}' "/proc/$server_pid/status")
  kill -TERM "$server_pid"
  wait "$server_pid" || true
  server_pid=
  # The server's own account of errors, kept beside the cell.
  grep -i 'error\|fail\|exceed' "$log_dir/$name.log" | tail -n 40 > "${file%.json}.server-errors.log" || true
  load_after=$(cut -d' ' -f1-3 /proc/loadavg)
  node -e '
    const fs = require("fs");
    const [cell, file, rss, before, after] = process.argv.slice(1);
    const r = JSON.parse(fs.readFileSync(cell, "utf8").trim().split("\n").pop());
    Object.assign(r, { peakRssMiB: Number(rss) / 1024, loadBefore: before, loadAfter: after });
    fs.writeFileSync(file + ".tmp", JSON.stringify(r) + "\n");
    fs.renameSync(file + ".tmp", file);' "$log_dir/cell.json" "$file" "$rss" "$load_before" "$load_after"
  rm -f "$log_dir/cell.json"
}

for i in "${!levels[@]}"; do
  level=${levels[$i]}
  count=${counts[0]}
  [ ${#counts[@]} -eq 1 ] || count=${counts[$i]}
  for name in "${server_list[@]}"; do
    file=$out/$name-c$level.json
    if [ -s "$file" ]; then
      echo "serve_vs_llamacpp: $name at concurrency $level: done ($file)"
      continue
    fi
    echo "serve_vs_llamacpp: $name at concurrency $level, $count requests ($(date -u +%H:%M:%SZ))"
    if [ -n "$lock" ]; then
      exec {lock_fd}> "$lock"
      flock "$lock_fd"
      run_cell "$name" "$level" "$count" "$file"
      flock -u "$lock_fd"
      exec {lock_fd}>&-
    else
      run_cell "$name" "$level" "$count" "$file"
    fi
  done
done
node bench/serve_vs_llamacpp_table.mjs "$out"
