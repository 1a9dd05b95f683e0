#!/bin/sh
# Every registered KV cache type and alias (`kvq help cache-types --names`,
# i.e. the codec registry) through generate, perplexity, bench, plan and serve
# startup on the shipped model, issue 19's schemes through study and tune, plus llama.cpp's -ctk/-ctv spellings and
# Hugging Face's KIVI words. A few tokens each: this checks the vocabulary
# is accepted end to end, not quality.
# Usage: kv_types_cli_test.sh KVQ_BINARY MODEL_DIR WORK_DIR
set -u
KVQ=$1 MODEL=$2 WORK=$3
[ -f "$MODEL/config.json" ] || { echo "skip: default model missing"; exit 77; }
mkdir -p "$WORK"
export OMP_WAIT_POLICY=PASSIVE
fail() { echo "FAIL: $*"; exit 1; }

# A deterministic text of a few hundred tokens, and KVQuant's calibration.
i=0; : >"$WORK/text.txt"
while [ $i -lt 60 ]; do
  echo "the cache keeps keys and values of every token while the model reads on $i" >>"$WORK/text.txt"
  i=$((i + 1))
done
"$KVQ" calibrate -m "$MODEL" -f "$WORK/text.txt" -o "$WORK/calib.safetensors" --tokens 256 \
  -c 128 -t 1 >"$WORK/out" 2>"$WORK/err" || fail "calibrate: $(cat "$WORK/err")"
CAL="--kv-calibration $WORK/calib.safetensors"

"$KVQ" help cache-types --names 64 >"$WORK/names" || fail "help cache-types --names"
[ "$(wc -l <"$WORK/names")" -ge 40 ] || fail "only $(wc -l <"$WORK/names") registered names"
for want in fp8 auto q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl kivi2 kvquant3 gear2; do
  grep -qx -- "$want" "$WORK/names" || fail "$want is not registered"
done

# The flags that put TYPE in the cache: K-only names (pre-RoPE, NUQ keys)
# as K with f16 values, NUQ values as V, anything else as both.
type_flags() {
  case "$1" in
    *prerope* | nuq?-k*) echo "--cache-type-k $1 --cache-type-v f16" ;;
    nuq?-v*) echo "--cache-type-k f16 --cache-type-v $1" ;;
    *) echo "--kv-cache-dtype $1" ;;
  esac
}

# serve_starts TYPE: the server comes up (listening line, /health) and stops on SIGTERM.
serve_starts() {
  # The previous server's output must not be mistaken for this one's (the
  # background job truncates the files only once it runs).
  rm -f "$WORK/serve.out" "$WORK/serve.err"
  # shellcheck disable=SC2086
  "$KVQ" serve -m "$MODEL" --port 0 -t 1 --max-model-len 256 $(type_flags "$1") $CAL \
    >"$WORK/serve.out" 2>"$WORK/serve.err" &
  pid=$!
  tries=0
  until grep -q "listening on" "$WORK/serve.out" 2>/dev/null; do
    tries=$((tries + 1))
    if [ $tries -gt 300 ] || ! kill -0 $pid 2>/dev/null; then
      kill $pid 2>/dev/null; wait $pid 2>/dev/null
      fail "serve --kv-cache-dtype $1 did not start: $(cat "$WORK/serve.err")"
    fi
    sleep 0.1
  done
  grep -q "KV cache " "$WORK/serve.err" || fail "serve --kv-cache-dtype $1: no cache line"
  # SIGTERM once /health answers. (The signal once thought lost between the
  # listening line and the listener's start was this script reading the
  # previous server's output; tests/server/serve_signal_test.mjs sends
  # SIGTERM at the listening line itself.)
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.out")
  tries=0
  until curl -sf -m 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ $tries -gt 300 ]; then
      kill -9 $pid; wait $pid 2>/dev/null
      fail "serve $(type_flags "$1"): /health did not answer"
    fi
    sleep 0.1
  done
  kill -TERM $pid; wait $pid || fail "serve --kv-cache-dtype $1 did not stop cleanly"
}

while read -r type; do
  # shellcheck disable=SC2086
  "$KVQ" generate -m "$MODEL" -p "The cache" -n 3 -t 1 -c 256 $(type_flags "$type") $CAL \
    >"$WORK/out" 2>"$WORK/err" || fail "generate --kv-cache-dtype $type: $(cat "$WORK/err")"
  # shellcheck disable=SC2086
  "$KVQ" perplexity -m "$MODEL" -f "$WORK/text.txt" -c 64 --chunks 2 -t 1 \
    $(type_flags "$type") $CAL >"$WORK/out" 2>"$WORK/err" ||
    fail "perplexity --kv-cache-dtype $type: $(cat "$WORK/err")"
  # shellcheck disable=SC2086
  "$KVQ" bench -m "$MODEL" -p 8 -n 2 -r 1 -t 1 $(type_flags "$type") $CAL >"$WORK/out" \
    2>"$WORK/err" || fail "bench --kv-cache-dtype $type: $(cat "$WORK/err")"
  # shellcheck disable=SC2046
  "$KVQ" plan -m "$MODEL" -c 1024 $(type_flags "$type") >"$WORK/out" 2>"$WORK/err" ||
    fail "plan --kv-cache-dtype $type: $(cat "$WORK/err")"
  serve_starts "$type"
done <"$WORK/names"

# Issue 19's schemes as study rows and as kvq tune candidates (calibrated ones
# included: tune takes --kv-calibration like the other commands).
i19="q8_0,q4_0,q4_1,q5_0,q5_1,iq4_nl,q4_0-norot,fp8_e4m3-t1,fp8_e4m3-tcal,int8_per_token_head"
i19="$i19,fp8_per_token_head,int4_per_token_head,hf-quanto-int4,hf-quanto-int2,turboquant_k8v4"
i19="$i19,turboquant_4bit_nc,turboquant_k3v4_nc,turboquant_3bit_nc,turboquant2.5,turboquant3.5"
i19="$i19,qjl_k1v4,oscar2,quarot2,int2-g64-asym-a2"
# shellcheck disable=SC2086
"$KVQ" study -m "$MODEL" -f "$WORK/text.txt" -t 1 --quick --ctx 64 --chunks 1 --capture 64 \
  --schemes "$i19" --recall-depths 0.5 $CAL --json "$WORK/study19.json" >"$WORK/out" \
  2>"$WORK/err" || fail "study --schemes $i19: $(cat "$WORK/err")"
python3 - "$WORK/study19.json" "$i19" <<'PY' || fail "study rows of issue 19's schemes"
import json, sys
names = [s.get("name", s.get("scheme")) for s in json.load(open(sys.argv[1]))["schemes"]]
missing = [n for n in sys.argv[2].split(",") if n not in names]
assert not missing, f"missing {missing} in {names}"
PY
# shellcheck disable=SC2086
"$KVQ" tune -m "$MODEL" -f "$WORK/text.txt" -t 1 -c 64 --windows 1 --kl-budget 1000 $CAL \
  --k-candidates f16,oscar-int2,qjl --v-candidates f16,tqv4,quanto2-g64-res128-a1 \
  -o "$WORK/policy.txt" >"$WORK/out" 2>"$WORK/err" || fail "tune with issue 19 candidates: $(cat "$WORK/err")"
grep -q "oscar-int2\|qjl\|nuq2" "$WORK/policy.txt" ||
  fail "tune with a budget of 1000 nats did not reach the smallest K candidates: $(cat "$WORK/policy.txt")"

# llama.cpp's spellings: -ctk/-ctv are named options, not -c tk.
"$KVQ" generate -m "$MODEL" -p "The cache" -n 3 -t 1 -ctk q8_0 -ctv q4_0 >"$WORK/out" \
  2>"$WORK/err" || fail "generate -ctk q8_0 -ctv q4_0: $(cat "$WORK/err")"
"$KVQ" generate -m "$MODEL" -p "The cache" -n 3 -t 1 -ctk q8_0 -ctv=q4_0 >"$WORK/out" \
  2>"$WORK/err" || fail "generate -ctk q8_0 -ctv=q4_0: $(cat "$WORK/err")"
"$KVQ" plan -m "$MODEL" -c 1024 -ctk q4_1 -ctv iq4_nl --json >"$WORK/plan.json" 2>"$WORK/err" ||
  fail "plan -ctk q4_1 -ctv iq4_nl: $(cat "$WORK/err")"
grep -q '"k_type": "q4_1"' "$WORK/plan.json" && grep -q '"v_type": "iq4_nl"' "$WORK/plan.json" &&
  grep -q '"context": 1024' "$WORK/plan.json" ||
  fail "plan -ctk q4_1 -ctv iq4_nl: not the cache types asked for: $(head -c 600 "$WORK/plan.json")"
"$KVQ" generate --help >"$WORK/help" 2>&1 || fail "generate --help"
for want in -ctk -ctv fp8=fp8_e4m3 iq4_nl -norot "help cache-types" --nbits; do
  grep -q -- "$want" "$WORK/help" || fail "generate --help lacks '$want'"
done
# Hugging Face's KIVI words.
"$KVQ" perplexity -m "$MODEL" -f "$WORK/text.txt" -c 64 --chunks 1 -t 1 --nbits 4 \
  --residual-length 32 --q-group-size 32 >"$WORK/out" 2>"$WORK/err" ||
  fail "perplexity --nbits 4 --residual-length 32 --q-group-size 32: $(cat "$WORK/err")"
# A bad name is a clear error naming it.
if "$KVQ" generate -m "$MODEL" -p x -n 1 -ctk q3_k >"$WORK/out" 2>"$WORK/err"; then
  fail "-ctk q3_k was accepted"
fi
grep -q "q3_k" "$WORK/err" || fail "-ctk q3_k error does not name it: $(cat "$WORK/err")"
echo "kv_types_cli_test: $(wc -l <"$WORK/names") types through generate, perplexity, plan, serve"
