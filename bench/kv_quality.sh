#!/usr/bin/env bash
# Quality of every KV cache type on a model and a held-out text: perplexity and
# KL divergence against an f32-cache baseline (log-probs stored in f32), top-1
# agreement, and bytes per token, as one markdown table.
#
#   bench/kv_quality.sh [MODEL] [TEXT] [CTX] [CHUNKS]
# Defaults: the shipped model, .deps/corpus/test.txt (held out from its
# training), --ctx 512, 20 windows. Needs: make build.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/kvq-tiny-qwen2}
text=${2:-.deps/corpus/test.txt}
ctx=${3:-512}
chunks=${4:-20}
kvq=build/bin/kvq
out=build/bench/kv_quality
mkdir -p "$out"
common=(-m "$model" -f "$text" --ctx "$ctx" --chunks "$chunks")
echo "== baseline: kvq perplexity ${common[*]} --kv-cache-dtype f32 --save-logits $out/base.logits --save-logits-f32"
"$kvq" perplexity "${common[@]}" --kv-cache-dtype f32 --save-logits "$out/base.logits" \
  --save-logits-f32 > "$out/f32.txt" 2>&1
configs=("f16" "bf16" "fp8_e4m3" "fp8_e5m2" "int8" "int8 --kv-rotate" "int4" "int4 --kv-rotate"
         "int4-g32-sym" "int4-g64" "int2" "int2 --kv-rotate"
         "f16 --cache-type-v int4" "int8 --cache-type-v int2" "int4 --cache-type-v int2")
echo
echo "| KV cache | bytes/token | PPL | mean KLD | 99% KLD | same top-1 % |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
row() {  # name, output file
  local name=$1 file=$2
  /usr/bin/python3 - "$name" "$file" <<'PY'
import re, sys
name, text = sys.argv[1], open(sys.argv[2]).read()
def grab(pattern, default="-"):
    m = re.search(pattern, text, re.M)
    return m.group(1) if m else default
bpt = grab(r"\(([\d.]+) bytes/token\)")
ppl = grab(r"^PPL:\s+([\d.]+ \+/- [\d.]+)")
kld = grab(r"^\s+mean KLD\s+(\S+ \+/- \S+)")
p99 = grab(r"^\s+99% KLD\s+(\S+)")
top1 = grab(r"^\s+same top-1\s+(\S+ \+/- \S+)")
print(f"| {name} | {bpt} | {ppl} | {kld} | {p99} | {top1} |")
PY
}
row "f32 (baseline)" "$out/f32.txt"
for cfg in "${configs[@]}"; do
  file="$out/$(echo "$cfg" | tr ' ' '_').txt"
  # shellcheck disable=SC2086
  "$kvq" perplexity "${common[@]}" --kv-cache-dtype $cfg --kl-divergence "$out/base.logits" \
    > "$file" 2>&1
  row "$cfg" "$file"
done
