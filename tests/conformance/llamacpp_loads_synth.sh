#!/usr/bin/env bash
# llama.cpp must load every GGUF that `kvq synth` writes: each preset family
# (Qwen2, Llama with llama3 rope scaling, odd sizes, GQA 7:1, real shapes)
# and each weight dtype kvq writes.
#   llamacpp_loads_synth.sh KVQ_BIN LLAMA_BIN_DIR DEPS_DIR WORK_DIR
set -euo pipefail
kvq=$1
harness="$2/kvq-llamacpp-harness"
deps=$3
work=$4
mkdir -p "$work"
vocab_qwen="$deps/llama.cpp/models/ggml-vocab-qwen2.gguf"
vocab_llama="$deps/llama.cpp/models/ggml-vocab-llama-bpe.gguf"
passed=0
failed=0
check() {  # preset vocab dtype
  local out="$work/$1-$3.gguf" result
  "$kvq" synth --preset "$1" --vocab "$2" --dtype "$3" --seed 7 -o "$out" >/dev/null
  # llama.cpp draws progress dots on stderr: keep it apart, show it on failure.
  if result=$("$harness" load "$out" 2>"$work/stderr") && [[ $result == ok* ]]; then
    echo "PASS llama.cpp loads $1 ($3): $result"
    passed=$((passed + 1))
  else
    echo "FAIL llama.cpp rejects $1 ($3): $result $(tail -n 5 "$work/stderr")"
    failed=$((failed + 1))
  fi
  rm -f "$out"
}
for dtype in f32 f16 bf16 q8_0; do
  check tiny-qwen2 "$vocab_qwen" "$dtype"
done
check tiny-llama-odd "$vocab_llama" f16
check tiny-qwen2-gqa7 "$vocab_qwen" f16
check tiny-llama3 "$vocab_llama" f16
check smollm2-135m "$vocab_llama" bf16
check qwen2.5-0.5b "$vocab_qwen" q8_0
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
