#!/usr/bin/env bash
# The main job on the embedded default model. Until `kvq study` lands, this
# shows what exists end to end: the shipped model (models/kvq-tiny-qwen2)
# described, a prompt tokenized, and a greedy completion with its speed.
set -euo pipefail
kvq=${1:-build/bin/kvq}
cd "$(dirname "$0")/.."
model=models/kvq-tiny-qwen2
if [ ! -f "$model/config.json" ]; then
  echo "demo: $model is missing; showing the Qwen2 vocabulary instead"
  "$kvq" info .deps/llama.cpp/models/ggml-vocab-qwen2.gguf
  "$kvq" tokenize .deps/llama.cpp/models/ggml-vocab-qwen2.gguf "KV caches store keys and values."
  exit 0
fi
echo "== kvq info (default model)"
"$kvq" info "$model"
echo
echo "== kvq tokenize"
"$kvq" tokenize "$model" "The keys and values of every past token are kept in the cache."
echo
echo "== kvq generate (default model, greedy, f16 KV cache)"
"$kvq" generate -p "It was the best of times" -n 48
echo
echo "== kvq generate --chat (ChatML template), sampled"
"$kvq" generate --chat -p "Tell me about the sea." -n 48 --temp 0.8 --seed 1
