#!/usr/bin/env bash
# One libFuzzer target for SECONDS from its seed corpus (make fuzz runs one per
# core). Prints the executed-units line, or the log's tail and fails.
#   scripts/fuzz_one.sh build-fuzz/bin/NAME_fuzz SECONDS
set -euo pipefail
binary=$1
seconds=$2
name=$(basename "$binary" _fuzz)
dir=$(dirname "$(dirname "$binary")")
mkdir -p "$dir/corpus/$name"
dict=()
[ -f "fuzz/$name.dict" ] && dict=(-dict="fuzz/$name.dict")
echo "fuzz: $name for ${seconds}s"
if ! "$binary" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    "$dir/corpus/$name" "fuzz/corpus/$name" > "$dir/$name.log" 2>&1; then
  tail -n 40 "$dir/$name.log"
  echo "fuzz: $name FAILED"
  exit 1
fi
echo "fuzz: $name $(grep -E '^stat::number_of_executed_units' "$dir/$name.log")"
