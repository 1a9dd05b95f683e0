#!/bin/sh
# kvq study from the command line: bad input fails with a clear message, and a
# small --quick run on the shipped model writes the JSON contract.
# Usage: study_cli_test.sh KVQ_BINARY MODEL_DIR TEXT WORK_DIR
set -u
KVQ=$1 MODEL=$2 TEXT=$3 WORK=$4
if [ ! -f "$MODEL/config.json" ] || [ ! -f "$TEXT" ]; then
  echo "skip: default model or held-out text missing"; exit 77
fi
mkdir -p "$WORK"
export OMP_WAIT_POLICY=PASSIVE
fail() { echo "FAIL: $*"; exit 1; }

# expect_error MESSAGE_PART ARGS...: exit code 1 and MESSAGE_PART on stderr.
expect_error() {
  want=$1; shift
  if "$KVQ" study -m "$MODEL" -t 1 --json "$WORK/unused.json" "$@" >"$WORK/out" 2>"$WORK/err"; then
    fail "kvq study $* succeeded"
  fi
  grep -q -- "$want" "$WORK/err" || fail "kvq study $*: stderr lacks '$want': $(cat "$WORK/err")"
}
expect_error "int3x" -f "$TEXT" --schemes f16,int3x
expect_error "cannot open" -f "$WORK/no-such-file.txt"
printf 'Too short a text.' >"$WORK/short.txt"
expect_error "tokens" -f "$WORK/short.txt" --quick
expect_error "exceeds\|--ctx" -f "$TEXT" --ctx 4096

"$KVQ" study -m "$MODEL" -f "$TEXT" -t 1 --quick --schemes int4,f16/int4 --recall-depths 0.5 \
  --json "$WORK/study.json" --dump "$WORK/capture.safetensors" >"$WORK/out" 2>"$WORK/err" ||
  fail "quick study failed: $(cat "$WORK/err")"
grep -q "K per-channel, V per-token (KIVI)" "$WORK/out" || fail "table lacks the fake-quant rows"
python3 - "$WORK/study.json" <<'PY' || fail "JSON contract"
import json, sys
j = json.load(open(sys.argv[1]))
for key in ["kvq_study_version", "created_utc", "command", "quick", "model", "text", "outliers",
            "fake_quant", "schemes", "memory", "timings_seconds"]:
    assert key in j, key
assert j["quick"] is True
assert [s["name"] for s in j["schemes"]] == ["f16", "int4", "f16/int4"], j["schemes"]
assert j["schemes"][0]["baseline"] and j["schemes"][2]["v_type"] == "int4"
assert len(j["memory"]["series"]) == 3
assert all(len(s["bytes"]) == len(j["memory"]["contexts"]) for s in j["memory"]["series"])
assert len(j["outliers"]["layers"]) == j["model"]["layers"]
PY
[ -s "$WORK/capture.safetensors" ] || fail "no dump"
echo "ok"
