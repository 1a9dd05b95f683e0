#!/usr/bin/env bash
# docs/models.md quotes what each real model file is; this checks every such
# figure against `kvq info` on the files set-up fetched, and the SHA-256s
# against the pins in scripts/assets.sha256 (which set-up verified).
#   models_doc_test.sh KVQ_BIN SOURCE_DIR
set -euo pipefail
kvq=$1
src=$2
doc="$src/docs/models.md"
models="$src/.deps/models"
fail=0
checked=0
# 98362432 -> 98,362,432, as the doc writes numbers (no locale needed).
commas() { echo "$1" | sed -e ':a' -e 's/\B[0-9]\{3\}\>/,&/' -e 'ta'; }
expect() {  # what, text that must appear in the doc
  if grep -qF -- "$2" "$doc"; then echo "PASS $1: '$2'"; else echo "FAIL $1: '$2' not in docs/models.md"; fail=1; fi
}
for file in SmolLM2-135M-Instruct.Q4_1.gguf qwen2.5-coder-0.5b-instruct.gguf qwen2.5-coder-1.5b-instruct.gguf; do
  path="$models/$file"
  if [ ! -f "$path" ]; then echo "SKIP $file: not fetched"; continue; fi
  info=$("$kvq" info "$path")
  field() { echo "$info" | sed -n "s/^$1: *//p"; }
  layers=$(field layers | sed 's/,.*//')
  read -r heads kv_heads head_dim <<<"$(field attention | sed -E 's/([0-9]+) heads, ([0-9]+) kv heads.*head_dim ([0-9]+).*/\1 \2 \3/')"
  context=$(field context | sed 's/ .*//')
  name=$(field name)
  file_type=$(field 'file type' | sed -E 's/([0-9]+) \((.*)\)/\1 = MOSTLY_\2/')
  kv=$(field 'KV cache f16' | sed 's/ bytes.*//')
  expect "$file name" "$name"
  expect "$file file" "\`$file\`"
  expect "$file shape" "$layers / $heads / $kv_heads / $head_dim"
  expect "$file context" "| $context |"
  expect "$file file type" "$file_type"
  expect "$file f16 KV bytes/token" "$(commas "$kv") bytes"
  expect "$file size" "$(commas "$(stat -L -c %s "$path")") bytes"
  expect "$file SHA-256" "$(awk -v n="$file" '$2 == n {print $1}' "$src/scripts/assets.sha256")"
  # Every tensor type the file uses, with its count (kvq info: "q4_1 x210").
  for pair in $(echo "$info" | sed -n 's/^parameters:.*(\(.*\)),.*/\1/p' | tr -d ' ' | tr ',' ' '); do
    type=$(echo "${pair%x*}" | tr a-z A-Z)
    expect "$file tensor type" "$type ×${pair##*x}"
  done
  checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || { echo "SKIP: no real model fetched (run scripts/setup.sh)"; exit 77; }
exit $fail
