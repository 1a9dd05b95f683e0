#!/usr/bin/env bash
# The main job on the embedded default model. Until `kvq study` lands this
# shows what exists: the model (or, before the default model is trained, the
# Qwen2 vocabulary) through `kvq info` and `kvq tokenize`.
set -euo pipefail
kvq=${1:-build/bin/kvq}
cd "$(dirname "$0")/.."
model=models/kvq-tiny-qwen2
[ -f "$model/config.json" ] || model=.deps/llama.cpp/models/ggml-vocab-qwen2.gguf
echo "== kvq info $model"
"$kvq" info "$model"
echo
echo "== kvq tokenize $model"
"$kvq" tokenize "$model" "KV caches store keys and values; quantizing them to 4 bits saves 4x memory."
