#!/usr/bin/env bash
# Side-by-side throughput: llama.cpp's llama-bench and `kvq bench` on the same
# `kvq synth --preset qwen2.5-0.5b` GGUF (F16 weights), same thread count, in
# one run, printing both and the ratio kvq / llama.cpp.
#
#   bench/vs_llamacpp.sh [THREADS] [REPETITIONS]
# Needs: make build, and scripts/build_llama_cpp.sh llama-bench (run here).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
reps=${2:-3}
kvq=build/bin/kvq
llama_bin=$(scripts/build_llama_cpp.sh llama llama-bench | tail -n 1)
model=build/bench/qwen2.5-0.5b-f16.gguf
mkdir -p build/bench
if [ ! -f "$model" ]; then
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
echo "== llama.cpp: llama-bench -m $model -t $threads -fa 1 -ctk f16 -ctv f16 -p 512 -n 128 -r $reps"
"$llama_bin/llama-bench" -m "$model" -t "$threads" -fa 1 -ctk f16 -ctv f16 -p 512 -n 128 \
  -r "$reps" -o json > build/bench/llamacpp.json
echo "== kvq: kvq bench -m $model -t $threads --kv-cache-dtype f16 -p 512 -n 128 -r $reps"
"$kvq" bench -m "$model" -t "$threads" --kv-cache-dtype f16 -p 512 -n 128 -r "$reps" \
  | tee build/bench/kvq.md
/usr/bin/python3 - build/bench/llamacpp.json build/bench/kvq.md <<'PY'
import json, re, sys
llama = {}
for row in json.load(open(sys.argv[1])):
    name = ("pp%d" % row["n_prompt"]) if row["n_gen"] == 0 else ("tg%d" % row["n_gen"])
    llama[name] = (row["avg_ts"], row["stddev_ts"])
kvq = {}
for line in open(sys.argv[2]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 8 and re.match(r"(pp|tg)\d+$", cells[6]):
        mean, sd = cells[7].split("±")
        kvq[cells[6]] = (float(mean), float(sd))
print("\n| test | llama.cpp t/s | kvq t/s | kvq / llama.cpp |")
print("| --- | ---: | ---: | ---: |")
for name in sorted(llama):
    if name in kvq:
        l, k = llama[name], kvq[name]
        print("| %s | %.2f ± %.2f | %.2f ± %.2f | %.2f |" % (name, l[0], l[1], k[0], k[1], k[0] / l[0]))
PY
