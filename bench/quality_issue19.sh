#!/usr/bin/env bash
# Issue 19 item 7: every issue-19 scheme (and the equal-byte kvq rows they are
# compared with) on one real model: KL / top-1 / PPL against the f16 cache,
# one `kvq perplexity` log per row. Resumable: a row whose log has a KL line
# is kept; calibrations and the f16 base are kept. Finished rows are copied
# (log + command) into docs/quality/TAG/ with `kvq plan --json` of their
# caches, and the docs/benchmarks.md block is regenerated
# (bench/quality_table.py; quality_doc_test checks it).
#
#   bench/quality_issue19.sh MODEL.gguf TAG [WORK_DIR]
#
# Settings from the environment: KVQ (default build/bin/kvq), CHUNKS (4),
# BASE_CHUNKS (CHUNKS), CALIB_TOKENS (2048), THREADS (2), NICE (19).
# Runs for hours on the shared 2-core machine; run it in the background.
set -u
model=$1 tag=$2
root=$(cd "$(dirname "$0")/.." && pwd)
out=${3:-$root/build/quality/$tag}
kvq=${KVQ:-$root/build/bin/kvq}
chunks=${CHUNKS:-4} threads=${THREADS:-2} nice_level=${NICE:-19}
mkdir -p "$out"
cd "$root" || exit 1
export OMP_WAIT_POLICY=PASSIVE
common="-m $model -f .deps/corpus/test.txt -c 512 -b 512 -t $threads"
say() { echo "$(date -u +%T) $*" >> "$out/progress"; }
if ! grep -q "saved:" "$out/f16.log" 2>/dev/null; then
  say f16
  echo "kvq perplexity $common --chunks ${BASE_CHUNKS:-$chunks} --kv-cache-dtype f16 --save-logits f16.logits" > "$out/f16.cmd"
  nice -n "$nice_level" "$kvq" perplexity $common --chunks "${BASE_CHUNKS:-$chunks}" --kv-cache-dtype f16 \
    --save-logits "$out/f16.logits" > "$out/f16.log" 2>&1
fi
calib() {  # objective bits
  [ -s "$out/calib_$1.safetensors" ] && return
  say "calib $1"
  local args="-f .deps/corpus/train.txt --bits $2 --tokens ${CALIB_TOKENS:-2048} -c 512 --rotation $1 -t $threads"
  echo "kvq calibrate -m $model $args -o calib_$1.safetensors" > "$out/calib_$1.cmd"
  # shellcheck disable=SC2086
  nice -n "$nice_level" "$kvq" calibrate -m "$model" $args -o "$out/calib_$1.safetensors" > "$out/calib_$1.log" 2>&1
}
run() {  # name calibration(qqt_sst|ktk_vtv|-) cache flags...
  local name=$1 cal=$2; shift 2
  grep -q "mean KLD" "$out/$name.log" 2>/dev/null && return
  local extra=()
  [ "$cal" != - ] && extra=(--kv-calibration "$out/calib_$cal.safetensors")
  say "$name"
  local shown="kvq perplexity $common --chunks $chunks $*"
  [ "$cal" != - ] && shown="$shown --kv-calibration calib_$cal.safetensors"
  echo "$shown --kl-divergence f16.logits" > "$out/$name.cmd"
  nice -n "$nice_level" "$kvq" perplexity $common --chunks "$chunks" "$@" "${extra[@]}" \
    --kl-divergence "$out/f16.logits" > "$out/$name.log" 2>&1
}
pair() { echo "--cache-type-k $1 --cache-type-v $2"; }
# shellcheck disable=SC2046
{
  run quarot2_codes - $(pair quarot-int2-clip96 quarot-int2-clip92)
  run int2g64_codes - $(pair int2-g64-asym int2-g64-asym)
  calib qqt_sst 2,3,4
  run oscar2_codes qqt_sst $(pair oscar-int2-clip96 oscar-int2-clip92)
  run oscar2 qqt_sst --kv-cache-dtype oscar2
  run kivi2 - --kv-cache-dtype kivi2
  run kvquant2 qqt_sst --kv-cache-dtype kvquant2
  run quarot2 - --kv-cache-dtype quarot2
  run hf-quanto-int2 - --kv-cache-dtype hf-quanto-int2
  run fp8_per_token_head - --kv-cache-dtype fp8_per_token_head
  for n in 1 4 16; do
    run kivi2_s$n - $(pair int2-c32-asym-r128-s$n int2-g32-asym-r128-s$n)
    run kivi2_a$n - $(pair int2-c32-asym-r128-a$n int2-g32-asym-r128-a$n)
  done
  for s in turboquant2.5 qjl_k1v4 turboquant3.5 turboquant_3bit_nc turboquant_k3v4_nc \
           turboquant_4bit_nc turboquant_k8v4 hf-quanto-int4 q4_0 int8 int8_per_token_head \
           int4_per_token_head; do
    run "$s" - --kv-cache-dtype "$s"
  done
  run kvquant3 qqt_sst --kv-cache-dtype kvquant3
  run kvquant4 qqt_sst --kv-cache-dtype kvquant4
  for n in 1 4 16; do
    run int2g64_s$n - $(pair int2-g64-asym-s$n int2-g64-asym-s$n)
    run int2g64_a$n - $(pair int2-g64-asym-a$n int2-g64-asym-a$n)
  done
  run oscar2_codes_s1 qqt_sst $(pair oscar-int2-clip96-s1 oscar-int2-clip92-s1)
  run oscar2_codes_a1 qqt_sst $(pair oscar-int2-clip96-a1 oscar-int2-clip92-a1)
  calib ktk_vtv 2
  run oscar2_codes_ktk ktk_vtv $(pair oscar-int2-clip96 oscar-int2-clip92)
  run oscar2_ktk ktk_vtv --kv-cache-dtype oscar2
  # llama.cpp's other cache types and vLLM's per-tensor fp8
  run q4_0_norot - --kv-cache-dtype q4_0-norot
  for s in q4_1 iq4_nl q5_0 q5_1 q8_0 fp8_e4m3-t1; do run "$s" - --kv-cache-dtype "$s"; done
  run fp8_e4m3-tcal qqt_sst --kv-cache-dtype fp8_e4m3-tcal
}
say done

# Ship: finished rows, their bytes, the regenerated table.
dst=$root/docs/quality/$tag
mkdir -p "$dst"
cp "$out/f16.log" "$out/f16.cmd" "$dst/"
for c in "$out"/*.cmd; do
  n=$(basename "$c" .cmd)
  case $n in
    f16) ;;
    calib_*) [ -s "$out/$n.safetensors" ] && cp "$c" "$out/$n.log" "$dst/" ;;
    *) grep -q "mean KLD" "$out/$n.log" 2>/dev/null && cp "$c" "$out/$n.log" "$dst/" ;;
  esac
done
"$kvq" plan -m "$model" --ctx 512 --batch 1 --types "$(python3 bench/quality_table.py types "$dst")" \
  --json > "$dst/plan.json"
python3 bench/quality_table.py embed docs/benchmarks.md docs/quality "$tag"
