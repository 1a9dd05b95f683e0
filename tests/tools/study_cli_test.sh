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
expect_error "context KL length 100000" -f "$TEXT" --no-core --context-kl-lengths 100000
expect_error "context KL length 511" -f "$TEXT" --no-core --context-kl-lengths 511

# The text under a name with a space: the JSON's command quotes it so that a
# shell reads the same arguments back.
cp "$TEXT" "$WORK/held out.txt"
"$KVQ" study -m "$MODEL" -f "$WORK/held out.txt" -t 1 --quick --schemes int4,f16/int4 \
  --recall-depths 0.5 --json "$WORK/study.json" --dump "$WORK/capture.safetensors" \
  >"$WORK/out" 2>"$WORK/err" || fail "quick study failed: $(cat "$WORK/err")"
grep -q "K per-channel, V per-token (KIVI)" "$WORK/out" || fail "table lacks the fake-quant rows"
python3 - "$WORK/study.json" "$MODEL" "$WORK" <<'PY' || fail "JSON contract"
import json, shlex, sys
j = json.load(open(sys.argv[1]))
for key in ["kvq_study_version", "created_utc", "command", "quick", "model", "text", "outliers",
            "fake_quant", "schemes", "memory", "timings_seconds"]:
    assert key in j, key
assert j["quick"] is True
want = "kvq study -m %s -f %s -t 1 --quick" % (shlex.quote(sys.argv[2]),
                                                shlex.quote(sys.argv[3] + "/held out.txt"))
assert j["command"].startswith(want), (j["command"], want)
assert [s["name"] for s in j["schemes"]] == ["f16", "int4", "f16/int4"], j["schemes"]
assert j["schemes"][0]["baseline"] and j["schemes"][2]["v_type"] == "int4"
assert len(j["memory"]["series"]) == 3
assert all(len(s["bytes"]) == len(j["memory"]["contexts"]) for s in j["memory"]["series"])
assert len(j["outliers"]["layers"]) == j["model"]["layers"]
assert j["kvq_study_version"] == 2
layer = j["outliers"]["layers"][0]
assert "k_pre_rope_channel_mean_abs" in layer and "k_pre_rope_channel_absmax" not in layer
assert "sinks" in layer and "v_stats" in layer and "k_bias" in j["outliers"]
assert len(j["fake_quant"]["rows"]) == 18 and j["fake_quant"]["claims"]
assert j["fake_quant"]["rows"][1]["per_channel_whole_sequence"] is True
PY
[ -s "$WORK/capture.safetensors" ] || fail "no dump"
# The printed Pareto front: the schemes no scheme with as few bits beats on KL.
python3 - "$WORK/study.json" "$WORK/out" <<'PY' || fail "Pareto front line"
import json, sys
s = json.load(open(sys.argv[1]))["schemes"]
front = [a for a in s if not any(b is not a and b["bits_per_value"] <= a["bits_per_value"] and
                                 b["kl_mean"] <= a["kl_mean"] and
                                 (b["bits_per_value"], b["kl_mean"]) != (a["bits_per_value"], a["kl_mean"])
                                 for b in s)]
front.sort(key=lambda a: -a["bits_per_value"])
want = ", ".join("%s (%.2f)" % (a["name"], a["bits_per_value"]) for a in front)
line = [l for l in open(sys.argv[2]) if l.startswith("Pareto front")]
assert len(line) == 1 and line[0].rstrip().endswith(": " + want), (line, want)
assert want.startswith("f16 (16.00)") and "int4 (5.00)" in want, want
PY
grep -q "The write-up's claims on this model" "$WORK/out" || fail "table lacks the claims"

# The long stages, tiny, into a results directory; a second run finds every
# result recorded and appends nothing (resumed).
printf '{"question": "1 + 1?", "answer": "#### 2"}\n{"question": "2 + 2?", "answer": "#### 4"}\n' \
  >"$WORK/gsm.jsonl"
rm -rf "$WORK/results"
long() {
  "$KVQ" study -m "$MODEL" -t 1 --no-core --niah --niah-tasks single_repeat --niah-contexts 512 \
    --niah-depths 0.5 --niah-trials 2 --niah-schemes f16 --gsm8k "$WORK/gsm.jsonl" \
    --gsm8k-problems 2 --gsm8k-max-tokens 8 --gsm8k-schemes f16,int4 \
    --results-dir "$WORK/results" --json "$WORK/long.json" >"$WORK/out" 2>"$WORK/err" ||
    fail "needle + GSM8K run failed: $(cat "$WORK/err")"
}
long
lines() { cat "$WORK"/results/needle/*/*.jsonl "$WORK"/results/gsm8k/*.jsonl | wc -l; }
[ "$(lines)" -eq 6 ] || fail "expected 2 needle trials + 2 x 2 GSM8K problems, got $(lines) lines"
long
[ "$(lines)" -eq 6 ] || fail "the rerun recomputed results: $(lines) lines"
grep -q "GSM8K (2 problems" "$WORK/out" || fail "no GSM8K table"
python3 - "$WORK/long.json" <<'PY' || fail "long-stage JSON"
import json, sys
j = json.load(open(sys.argv[1]))
assert "outliers" not in j and "schemes" not in j  # --no-core
assert [s["name"] for s in j["needle"]["schemes"]] == ["f16"]
assert j["needle"]["schemes"][0]["cells"][0]["trials"] == 2
assert [s["name"] for s in j["gsm8k"]["schemes"]] == ["f16", "int4"]
assert 0 <= j["gsm8k"]["schemes"][0]["wilson95_low"] <= j["gsm8k"]["schemes"][0]["wilson95_high"]
pair = j["gsm8k"]["paired"][0]
assert (pair["a"], pair["b"]) == ("f16", "int4")
assert sum(pair[k] for k in ("only_a_correct", "only_b_correct", "both_correct",
                             "neither_correct")) == 2
assert 0 < pair["mcnemar_exact_p"] <= 1
PY
"$KVQ" study --compare "$WORK/study.json,$WORK/long.json" --report "$WORK/compare.html" \
  >"$WORK/out" 2>"$WORK/err" || fail "--compare failed: $(cat "$WORK/err")"
grep -q "models side by side" "$WORK/compare.html" || fail "no comparison page"
# A study directory: study.json plus a long stage's file beside it, merged.
rm -rf "$WORK/dir" && mkdir -p "$WORK/dir"
cp "$WORK/study.json" "$WORK/dir/study.json"
cp "$WORK/long.json" "$WORK/dir/gsm8k.json"
"$KVQ" study --compare "$WORK/dir,$WORK/study.json" --report "$WORK/compare-dir.html" \
  >"$WORK/out" 2>"$WORK/err" || fail "--compare of a directory failed: $(cat "$WORK/err")"
grep -q 'id="chart-compare-tasks"' "$WORK/compare-dir.html" ||
  fail "the directory's gsm8k.json did not reach the comparison page"
cp "$WORK/long.json" "$WORK/dir/needle.json"  # holds gsm8k too, but only needle is read
"$KVQ" study --compare "$WORK/dir" --report "$WORK/compare-dir.html" >"$WORK/out" 2>"$WORK/err" ||
  fail "--compare with needle.json beside gsm8k.json failed: $(cat "$WORK/err")"
echo "ok"
