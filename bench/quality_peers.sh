#!/usr/bin/env bash
# The peers' KV caches beside kvq's on one model, one text and the same
# windows: llama.cpp's llama-perplexity -ctk/-ctv types (with its default
# Hadamard rotation of quantized K/V and without), Hugging Face transformers'
# QuantizedCache (optimum-quanto backend), and kvq's schemes. Every engine is
# scored against its own f16-cache run (mean and p99 KL, same top-1), so each
# row measures what that engine's cache quantization costs.
#
#   bench/quality_peers.sh MODEL.gguf TEXT OUT_DIR [CHUNKS]
#
# Writes OUT_DIR/peers.json (every figure, command and check) and
# OUT_DIR/peers.md (the table, rendered from peers.json by bench/peers_table.py),
# logs under OUT_DIR/logs/. CHUNKS = 512-token windows (default 8). Measured
# on SmolLM2-135M on the shared 2-core machine: each llama.cpp or kvq row
# 1-4 minutes (by load), kvq's token-by-token rows (NAME_b1) 1-2 minutes,
# the transformers rows 15 minutes (token by token), so 60-90 minutes in all;
# PHASES runs parts side by side. Settings from the environment: KVQ (default
# build/bin/kvq), LLAMA_BIN (the llama.cpp bin/ with llama-perplexity;
# default: scripts/build_llama_cpp.sh's), THREADS (2), KVQ_ROWS (a comma
# list of kvq's row names, NAME_b1 for the token-by-token ones: only those;
# default all),
# HF_WINDOWS (windows for the transformers rows, default CHUNKS: they decode
# token by token), HF_THREADS (1), HF_BATCH (windows the transformers rows decode
# together, each its own sequence: one pass of matrix products serves them all;
# default 1), CALIB_TEXT (kvq calibrate's text, default the corpus'
# train split), SKIP_HF=1 (no transformers rows), PHASES (default
# "llama kvq hf table"; e.g. PHASES=kvq runs only kvq's rows, so phases can
# run side by side and a last run with the default renders the table).
# A step that succeeded before with the same command is not rerun.
# Needs: make build, and scripts/setup_peers.sh for the transformers rows.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,30p "$0"; exit 2; }
model=$1 text=$2 out=$3 chunks=${4:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
kvq=${KVQ:-$root/build/bin/kvq}
threads=${THREADS:-2}
hf_windows=${HF_WINDOWS:-$chunks}
# One intra-op thread for transformers: a decode step is ~600 tiny ops, and on
# a busy machine every OpenMP barrier of a 2-thread op can wait a time slice.
hf_threads=${HF_THREADS:-1}
hf_batch=${HF_BATCH:-1}
phases=" ${PHASES:-llama kvq hf table} "
phase() { [[ "$phases" == *" $1 "* ]]; }
calib_text=${CALIB_TEXT:-$root/.deps/corpus/train.txt}
if [ -z "${LLAMA_BIN:-}" ]; then
  LLAMA_BIN=$("$root/scripts/build_llama_cpp.sh" llama llama-perplexity | tail -n 1)
fi
for f in "$model" "$text" "$kvq" "$LLAMA_BIN/llama-perplexity"; do
  [ -e "$f" ] || { echo "quality_peers: $f not found" >&2; exit 1; }
done
mkdir -p "$out/logs" "$out/work"
logs=$out/logs work=$out/work
cmds=$out/logs/commands.tsv  # name <TAB> exact command, read by peers_table.py
: > "$cmds"
say() { echo "[$(date +%H:%M:%S)] $*"; }
# run NAME ENV... -- CMD...: runs the command with its log in logs/NAME.log and
# records it (env assignments first, as one would type it). A step that
# already succeeded with the same command (work/NAME.done holds it) is not
# run again, so a killed run continues where it stopped.
run() {
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local cmd="${envs[*]}${envs:+ }$*"
  printf '%s\t%s\n' "$name" "$cmd" >> "$cmds"
  if [ -f "$work/$name.done" ] && [ "$(cat "$work/$name.done")" = "$cmd" ]; then
    say "$name: done before, kept"; return
  fi
  say "$name"
  rm -f "$work/$name.done"
  if ! env "${envs[@]}" "$@" > "$logs/$name.log" 2>&1; then
    tail -n 20 "$logs/$name.log"; echo "quality_peers: $name failed" >&2; exit 1
  fi
  printf '%s' "$cmd" > "$work/$name.done"
}

# --- llama.cpp: f16 baseline, then each type with and without rotation.
lp=$LLAMA_BIN/llama-perplexity
lcommon=(-m "$model" -c 512 -b 512 -fa on -t "$threads" -lv 4)
run llama_f16 -- "$lp" "${lcommon[@]}" -f "$text" --chunks "$chunks" -ctk f16 -ctv f16 \
  --kl-divergence-base "$work/llama_f16.kld"
for x in q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl; do
  phase llama || break
  run "llama_${x}_rot" -- "$lp" "${lcommon[@]}" -ctk "$x" -ctv "$x" \
    --kl-divergence-base "$work/llama_f16.kld" --kl-divergence
  run "llama_${x}_norot" LLAMA_ATTN_ROT_DISABLE=1 -- "$lp" "${lcommon[@]}" -ctk "$x" -ctv "$x" \
    --kl-divergence-base "$work/llama_f16.kld" --kl-divergence
done

# --- kvq: f16 baseline (also scored against llama.cpp's f16 run: the
# cross-engine check), calibration for KVQuant, then each scheme.
kcommon=(perplexity -m "$model" -f "$text" -c 512 -b 512 --chunks "$chunks" -t "$threads")
phase kvq || phase hf && run kvq_f16 -- "$kvq" "${kcommon[@]}" --kv-cache-dtype f16 --save-logits "$work/kvq_f16.logits" \
  --kl-divergence "$work/llama_f16.kld"
phase kvq && run kvq_calibrate -- "$kvq" calibrate -m "$model" -f "$calib_text" -o "$work/kvq_calib.safetensors" \
  --bits 2,3,4 --tokens 4096 -t "$threads"
# name|flags; bytes come from `kvq plan` with the same flags.
kvq_schemes=(
  "int8|--kv-cache-dtype int8" "fp8_e4m3|--kv-cache-dtype fp8_e4m3"
  "int4|--kv-cache-dtype int4" "int4_rot|--kv-cache-dtype int4 --kv-rotate"
  "kivi4|--kv-cache-dtype kivi4"
  "kvquant4|--kv-cache-dtype kvquant4 --kv-calibration $work/kvq_calib.safetensors"
  "kvquant3|--kv-cache-dtype kvquant3 --kv-calibration $work/kvq_calib.safetensors"
  "int2|--kv-cache-dtype int2"
  "kivi2|--kv-cache-dtype kivi2" "gear2|--kv-cache-dtype gear2"
  "kvquant2|--kv-cache-dtype kvquant2 --kv-calibration $work/kvq_calib.safetensors"
  # Issue 19: the peers' formats and the papers' settings inside kvq (their
  # study on both real models: docs/quality/, bench/quality_table.py).
  "q8_0|--kv-cache-dtype q8_0" "q4_0|--kv-cache-dtype q4_0" "q4_1|--kv-cache-dtype q4_1"
  "q5_0|--kv-cache-dtype q5_0" "q5_1|--kv-cache-dtype q5_1" "iq4_nl|--kv-cache-dtype iq4_nl"
  "int8_per_token_head|--kv-cache-dtype int8_per_token_head"
  "fp8_per_token_head|--kv-cache-dtype fp8_per_token_head"
  "int4_per_token_head|--kv-cache-dtype int4_per_token_head"
  "hf-quanto-int4|--kv-cache-dtype hf-quanto-int4" "hf-quanto-int2|--kv-cache-dtype hf-quanto-int2"
  "turboquant_k8v4|--kv-cache-dtype turboquant_k8v4"
  "turboquant_4bit_nc|--kv-cache-dtype turboquant_4bit_nc"
  "turboquant_k3v4_nc|--kv-cache-dtype turboquant_k3v4_nc"
  "turboquant_3bit_nc|--kv-cache-dtype turboquant_3bit_nc"
  "turboquant3.5|--kv-cache-dtype turboquant3.5" "turboquant2.5|--kv-cache-dtype turboquant2.5"
  "qjl_k1v4|--kv-cache-dtype qjl_k1v4"
  "oscar2|--kv-cache-dtype oscar2 --kv-calibration $work/kvq_calib.safetensors"
  "quarot2|--kv-cache-dtype quarot2"
)
# The same kvq formats fed one token at a time, as the transformers rows are
# (-b 1, the transformers rows' windows), named NAME_b1: with an f16 window of
# the newest tokens (quanto's residual, KIVI's) a token attends its neighbours
# unquantized, where a 512-token prefill has quantized them first. So a
# transformers row is compared with these and with the prefill rows (a
# prefill never attends less quantized data); a llama.cpp row (prefilled)
# only with the prefill rows. KIVI at g64 stores as many bytes a token as
# quanto's g64; with KIVI's 128-token window (r128) it holds more at 512
# tokens than quanto's residual of 128 (a key group waits for 64 tokens), with
# a 64-token window (r64) less.
kvq_token_schemes=(
  "hf-quanto-int4_b1|--kv-cache-dtype hf-quanto-int4" "hf-quanto-int2_b1|--kv-cache-dtype hf-quanto-int2"
  "kivi4_g64_b1|--kv-cache-dtype int4-c64-asym-r128/int4-g64-asym-r128"
  "kivi2_g64_b1|--kv-cache-dtype int2-c64-asym-r128/int2-g64-asym-r128"
  "kivi4_g64r64_b1|--kv-cache-dtype int4-c64-asym-r64/int4-g64-asym-r64"
  "kivi2_g64r64_b1|--kv-cache-dtype int2-c64-asym-r64/int2-g64-asym-r64"
)
ktoken=(perplexity -m "$model" -f "$text" -c 512 -b 1 --chunks "$hf_windows" -t "$threads")
plan_schemes=("f16|--kv-cache-dtype f16" "${kvq_schemes[@]}" "${kvq_token_schemes[@]}")
# KVQ_ROWS=a,b,...: only these of kvq's rows (the f16 baseline always runs).
wanted() { [ -z "${KVQ_ROWS:-}" ] || [ "$1" = f16 ] || [[ ",$KVQ_ROWS," == *",$1,"* ]]; }
for s in "${plan_schemes[@]}"; do
  phase table || break
  name=${s%%|*} flags=${s#*|}
  wanted "$name" || continue
  type=$(echo "$flags" | sed -E 's/.*--kv-cache-dtype ([^ ]+).*/\1/')
  # shellcheck disable=SC2086
  "$kvq" plan -m "$model" -c 512 $flags --types "$type" --json > "$work/plan_$name.json"
done
for s in "${kvq_schemes[@]}" "${kvq_token_schemes[@]}"; do
  phase kvq || break
  name=${s%%|*} flags=${s#*|}
  wanted "$name" || continue
  feed=("${kcommon[@]}")
  [[ $name == *_b1 ]] && feed=("${ktoken[@]}")
  # shellcheck disable=SC2086
  run "kvq_$name" -- "$kvq" "${feed[@]}" $flags --kl-divergence "$work/kvq_f16.logits"
done

# --- Hugging Face transformers' QuantizedCache, token by token on the same
# token ids (read from llama.cpp's base file).
if [ "${SKIP_HF:-0}" != 1 ] && phase hf; then
  py=$root/.deps/venv-peers/bin/python
  "$root/scripts/setup_peers.sh" --check ||
    { echo "quality_peers: run scripts/setup_peers.sh first (or SKIP_HF=1)" >&2; exit 1; }
  run hf -- "$py" "$root/bench/peers_hf.py" --gguf "$model" --llama-base "$work/llama_f16.kld" \
    --kvq-base "$work/kvq_f16.logits" --windows "$hf_windows" --threads "$hf_threads" --batch "$hf_batch" \
    -o "$work/hf.json"
fi

phase table || exit 0
/usr/bin/python3 "$root/bench/peers_table.py" collect --out "$out" --model "$model" --text "$text" \
  --chunks "$chunks" --threads "$threads" --llama-bin "$LLAMA_BIN"
/usr/bin/python3 "$root/bench/peers_table.py" render "$out/peers.json" > "$out/peers.md"
say "wrote $out/peers.json and $out/peers.md (work/ holds the logits files, hundreds of MB)"
