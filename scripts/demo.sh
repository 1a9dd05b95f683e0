#!/usr/bin/env bash
# The main job on the embedded default model: `kvq study` on the shipped model
# (models/kvq-tiny-qwen2) and the held-out test text of the corpus — outlier
# structure of its real K/V, the fake-quant comparison, every cache scheme end
# to end (perplexity, KL, top-1, recall, bytes) — written to out/study.json and
# the offline HTML report out/study.html. Then one greedy completion.
set -euo pipefail
kvq=${1:-build/bin/kvq}
cd "$(dirname "$0")/.."
model=models/kvq-tiny-qwen2
text=.deps/corpus/test.txt
mkdir -p out
echo "== kvq study (default model, held-out text $text)"
"$kvq" study -m "$model" -f "$text" --json out/study.json --report out/study.html
echo
echo "report: out/study.html (open it in a browser; it works offline)"
echo
echo "== kvq generate (default model, greedy, kivi2 KV cache)"
"$kvq" generate -m "$model" -p "It was the best of times" -n 32 --kv-cache-dtype kivi2
