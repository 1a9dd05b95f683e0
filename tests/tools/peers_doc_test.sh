#!/usr/bin/env bash
# The peer tables that ship (docs/peers/MODEL/peers.md, and the copy embedded
# in docs/benchmarks.md) must be what their peers.json renders to, so no
# number in the docs can drift from the data beside it. Also checks that the
# comparison can fail: a peers.json with one KL changed must not render to
# the shipped table.
#   peers_doc_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1
work=$2
render="$src/bench/peers_table.py"
bench_doc="$src/docs/benchmarks.md"
mkdir -p "$work"
fail=0
checked=0
for json in "$src"/docs/peers/*/peers.json; do
  [ -f "$json" ] || continue
  dir=$(dirname "$json")
  name=$(basename "$dir")
  python3 "$render" render "$json" > "$work/$name.md"
  if diff -u "$dir/peers.md" "$work/$name.md" > "$work/$name.diff"; then
    echo "PASS $name: peers.md is what peers.json renders to"
  else
    echo "FAIL $name: peers.md differs from the rendering of peers.json:"; head -40 "$work/$name.diff"
    fail=1
  fi
  # The embedded copy: everything between the markers, byte for byte.
  sed -n "/^<!-- peers:$name begin -->\$/,/^<!-- peers:$name end -->\$/p" "$bench_doc" |
    sed '1d;$d' > "$work/$name.embedded.md"
  if [ ! -s "$work/$name.embedded.md" ]; then
    echo "FAIL $name: docs/benchmarks.md has no <!-- peers:$name begin/end --> block"; fail=1
  elif diff -u "$work/$name.md" "$work/$name.embedded.md" > "$work/$name.embedded.diff"; then
    echo "PASS $name: docs/benchmarks.md embeds the same table"
  else
    echo "FAIL $name: docs/benchmarks.md's copy differs:"; head -40 "$work/$name.embedded.diff"
    fail=1
  fi
  # Every llama.cpp row's log check says what the row claims.
  if python3 - "$json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
bad = []
for r in d["rows"]:
    if r["engine"] != "llama.cpp":
        continue
    c = r["log_check"]
    want = 0 if ("no rotation" in r["cache"] or r["cache"].startswith("f16")) else 1
    if (c["attn_rot_k"], c["attn_rot_v"]) != (want, want) or not c["flash_attn"]:
        bad.append(r["id"])
    if "LLAMA_ATTN_ROT_DISABLE=1" in r["command"] and want:
        bad.append(r["id"])
sys.exit(1 if bad else 0)
PY
  then echo "PASS $name: llama.cpp rows' logs show the intended rotation and flash attention"
  else echo "FAIL $name: a llama.cpp row's log check contradicts its label"; fail=1
  fi
  # Can the check fail? Change one KL and the rendering must differ.
  python3 - "$json" "$work/$name.tampered.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
row = next(r for r in d["rows"] if "mean_kl" in r)
row["mean_kl"] *= 1.5
json.dump(d, open(sys.argv[2], "w"))
PY
  python3 "$render" render "$work/$name.tampered.json" > "$work/$name.tampered.md"
  if cmp -s "$dir/peers.md" "$work/$name.tampered.md"; then
    echo "FAIL $name: a changed KL renders to the same table (the check cannot fail)"; fail=1
  else
    echo "PASS $name: a changed KL is caught"
  fi
  checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || { echo "FAIL: no docs/peers/*/peers.json"; exit 1; }
# The verdict's schedule rule: a prefilled peer (llama.cpp) is never answered
# by a kvq row fed token by token (kinder to windowed caches); a transformers
# peer (token by token) is answered by any kvq row.
if python3 - "$src/bench" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import peers_table as t
def row(engine, id_, kl):
    return dict(engine=engine, id=id_, cache=id_, mean_kl=kl, bytes_per_token=100,
                bytes_per_token_ctx=100)
rows = [row("llama.cpp", "llama_q4_0_rot", 0.05), row("transformers", "hf_quanto4", 0.05),
        row("kvq", "kvq_kivi4_g64_b1", 0.01), row("kvq", "kvq_q4_0", 0.06)]
v = {p["id"]: (b["id"], wins) for p, b, wins in t.verdicts(rows)}
assert v == {"llama_q4_0_rot": ("kvq_q4_0", False),
             "hf_quanto4": ("kvq_kivi4_g64_b1", True)}, v
PY
then echo "PASS: llama.cpp rows are compared with kvq's prefilled rows only"
else echo "FAIL: the verdict's schedule rule"; fail=1
fi
exit $fail
