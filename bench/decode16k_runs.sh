#!/bin/bash
# Issue 19's Decode16K rows: one attention_bench run per (shape, codec), that
# codec beside f16 and int4 in the same run, 1 and 2 threads. Run it on a
# quiet machine, e.g. under a shared lock at raised priority:
#   flock LOCK nice -n -10 bench/decode16k_runs.sh docs/bench/decode16k
# Resumable: a run whose JSON exists is skipped, so delete a JSON to measure
# it again.
#
#   bench/decode16k_runs.sh OUT_DIR [BINARY] [SHAPES] [CODECS]
#
# OUT_DIR gets SHAPE.CODEC.{json,cmd,load} (`uptime` before and after);
# bench/decode16k_table.py embeds the table from them. SHAPES and CODECS are
# space-separated (defaults: both shapes, every codec of the Decode16K list).
set -euo pipefail
out=${1:?usage: bench/decode16k_runs.sh OUT_DIR [BINARY] [SHAPES] [CODECS]}
bin=$(realpath "${2:-build/bin/attention_bench}")
shapes=${3:-"qwen2.5-0.5b smollm2-135m"}
mkdir -p "$out"
if [ -z "${4:-}" ]; then
  # Every codec attention_bench lists for the first shape, f16 aside.
  first=${shapes%% *}
  codecs=$("$bin" --benchmark_list_tests 2>/dev/null |
    sed -n "s#^Decode16K/$first/\([^/]*\)/ctx:16384/threads:1/.*#\1#p" | grep -vx f16)
else
  codecs=$4
fi
cd "$out"
for shape in $shapes; do
  for codec in $codecs; do
    name=$shape.$codec
    [ -s "$name.json" ] && continue
    re=$(printf '%s' "$codec" | sed 's/[.+]/\\&/g')
    cmd=("$bin" "--benchmark_filter=^Decode16K/$shape/(f16|int4|$re)/ctx:16384/"
      --benchmark_min_time=1 --benchmark_out_format=json "--benchmark_out=$name.json.part")
    echo "${cmd[*]}" | sed "s#$bin#attention_bench#; s#\.part##" > "$name.cmd"
    echo "before $(uptime)" > "$name.load"
    "${cmd[@]}" > /dev/null
    echo "after $(uptime)" >> "$name.load"
    mv "$name.json.part" "$name.json"
    echo "$name done"
  done
done
