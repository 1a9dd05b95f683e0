#!/usr/bin/env bash
# The study's long stages on the shipped models (issue 17: GSM8K, the needle
# grid, KL by context length), run so that they survive being spread over
# several sessions and machines: every answer is appended to a results
# directory inside the repository (docs/study/<model>/results/), which is
# committed as it grows, and a rerun continues from it (kvq study's
# --results-dir). After each round the stage's JSON (gsm8k.json, needle.json,
# context_kl.json beside the model's study.json) is rewritten from every
# result so far, so what ships always says how many problems or trials it
# covers.
#
#   bench/study_long.sh gsm8k [ROUNDS]     Qwen2.5-Coder-1.5B-Instruct, problems
#                                          in rounds (default 50,100,150,200,250)
#   bench/study_long.sh niah MODEL_STEM    needle grid: every task at 1K-4K and,
#                                          for the tasks f16 passes there, 8K
#                                          (within the model's context), 5 depths,
#                                          in rounds of 5, 10 and 20 trials a cell
#   bench/study_long.sh context-kl MODEL_STEM   KL vs f16 by context length,
#                                          512 to the model's context
#   bench/study_long.sh core MODEL_STEM    the core study (structure, the
#                                          write-up's table, every scheme end to
#                                          end) into the model's study.json and
#                                          log.txt; schemes recorded as they
#                                          finish, so a rerun resumes
#
# MODEL_STEM is a file name under .deps/models/ without .gguf. Settings from
# the environment: KVQ (default build/bin/kvq), THREADS (default 2),
# GSM8K_SCHEMES, NIAH_TASKS, NIAH_CONTEXTS, NIAH_EXTEND (longer contexts run only for the tasks
# f16 passes at every shorter one; empty for none), NIAH_ROUNDS, NIAH_SCHEMES
# (only these besides f16: two THREADS=1 processes on disjoint schemes keep
# two cores busier than one two-thread process, whose decode steps are too
# small to split well), CONTEXT_KL_LENGTHS, SIMD_TARGET (kvq --simd-target:
# a run resumed on a CPU with a better target keeps the target its records
# were made on, e.g. AVX3 on an AVX3_DL machine). A narrower grid or
# fewer lengths reuse what is recorded, and a later full run extends them.
# Progress goes to standard error; run it under nohup with a log file.
set -euo pipefail
cd "$(dirname "$0")/.."
kvq=${KVQ:-build/bin/kvq}
threads=${THREADS:-2}
stage=${1:?stage: gsm8k, niah or context-kl}

# The issue's GSM8K set: the f16 baseline, KIVI-2 with and without its
# 128-token f16 window (the write-up says 2-bit without it "craters"), and
# plain per-token int2; then the frontier of section 3 (int8, KIVI-4,
# KVQuant-3) and per-token int4, kvq's default set and more. GSM8K_SCHEMES
# runs a prefix of it (each run adds the schemes not recorded yet).
gsm8k_schemes=${GSM8K_SCHEMES:-f16,kivi2,int2-c32-asym/int2-g32-asym,int2,int8,kivi4,kvquant3,int4}

# The core study's schemes on the real models: every family at 8, 4 and 2
# bits, rotation on and off, sinks, the Qwen2 boundary-layer policies, and
# KIVI-2 without its window. The shipped SmolLM2 and 0.5B studies predate the
# two int4 policies (their runs kept no end-to-end results to resume from).
core_schemes=f16,bf16,fp8_e4m3,fp8_e5m2,int8,int4,int4+rot,int2,int2+rot,f16/int4,kivi4,kivi2
core_schemes+=,int2-c32-asym/int2-g32-asym,int2-s4,policy:docs/study/policies/int4_boundary.txt
core_schemes+=,policy:docs/study/policies/int4_layer0.txt
core_schemes+=,policy:docs/study/policies/int2_boundary.txt
core_schemes+=,policy:docs/study/policies/kivi2_boundary.txt,gear4,gear2,kvquant4,kvquant3,kvquant2

study() {  # study MODEL_STEM JSON_PATH FLAGS... (a bare JSON name goes beside the study)
  local stem=$1 json=$2
  shift 2
  local dir=docs/study/$stem
  [[ "$json" == */* ]] || json=$dir/$json
  mkdir -p "$dir/results" "$(dirname "$json")"
  echo "[$(date -u +%H:%M:%S)] kvq study -m .deps/models/$stem.gguf $*" >&2
  "$kvq" ${SIMD_TARGET:+--simd-target "$SIMD_TARGET"} study -m ".deps/models/$stem.gguf" \
    -t "$threads" --no-core \
    --results-dir "$dir/results" --json "$json" "$@"
}

case $stage in
  gsm8k)
    for n in $(echo "${2:-50,100,150,200,250}" | tr , ' '); do
      study qwen2.5-coder-1.5b-instruct gsm8k.json --gsm8k-problems "$n" \
        --gsm8k-schemes "$gsm8k_schemes" --gsm8k-batch 64 --gsm8k-max-tokens 512
    done
    ;;
  niah)
    # Rounds of trials (the count is not part of the results' configuration,
    # so each round only adds trials): the whole grid at 5, then 10, then 20.
    # NIAH_SCHEMES runs a subset (f16 first: every scheme is judged where it
    # passes), e.g. in a second one-thread process beside a full run; its JSON
    # then goes under build/, and needle.json is left to a run of the whole set.
    json=needle.json
    if [ -n "${NIAH_SCHEMES:-}" ]; then
      json=build/study_long/${2:?model stem}-needle-$(echo "$NIAH_SCHEMES" | tr -c 'A-Za-z0-9.\n-' _).json
    fi
    for trials in $(echo "${NIAH_ROUNDS:-5,10,20}" | tr , ' '); do
      extend=${NIAH_EXTEND-8192}
      study "${2:?model stem}" "$json" --niah ${NIAH_SCHEMES:+--niah-schemes "f16,$NIAH_SCHEMES"} \
        --niah-tasks "${NIAH_TASKS:-single_repeat,single_needle,multikey_repeat,multivalue_repeat}" \
        --niah-contexts "${NIAH_CONTEXTS:-1024,2048,4096}" \
        ${extend:+--niah-extend-contexts "$extend"} --niah-trials "$trials"
    done
    ;;
  context-kl)
    study "${2:?model stem}" context_kl.json --context-kl-lengths \
      "${CONTEXT_KL_LENGTHS:-512,1024,2048,4096,8192}"
    ;;
  core)
    stem=${2:?model stem}
    dir=docs/study/$stem
    mkdir -p "$dir/results"
    echo "[$(date -u +%H:%M:%S)] kvq study -m .deps/models/$stem.gguf (core)" >&2
    "$kvq" ${SIMD_TARGET:+--simd-target "$SIMD_TARGET"} study -m ".deps/models/$stem.gguf" \
      -t "$threads" --chunks 2 --recall-contexts 512 \
      --calib-tokens 2048 --schemes "$core_schemes" --results-dir "$dir/results" \
      --json "$dir/study.json" 2>&1 | tee "$dir/log.txt.tmp" >&2
    mv "$dir/log.txt.tmp" "$dir/log.txt"
    ;;
  *)
    echo "study_long: unknown stage $stage (gsm8k, niah, context-kl, core)" >&2
    exit 2
    ;;
esac
