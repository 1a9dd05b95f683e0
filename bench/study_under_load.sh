#!/usr/bin/env bash
# Wall time of the demo's study (scripts/demo.sh's `kvq study` on the default
# model) on an idle machine and with one core busy (a one-thread spin loop in
# its own session, bench/busy_core.sh). Usage:
#   bench/study_under_load.sh KVQ OUT_LOG
set -euo pipefail
source "$(dirname "$0")/busy_core.sh"
kvq=$1 out=$2
model=.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf text=.deps/corpus/test.txt
tmp=$(mktemp -d)
study() {  # $1 = label
  local t0 t1
  t0=$(date +%s.%N)
  "$kvq" study -m "$model" -f "$text" --json "$tmp/$1.json" --report "$tmp/$1.html" > "$tmp/$1.log" 2>&1
  t1=$(date +%s.%N)
  echo "$1 study: $(echo "$t1 - $t0" | bc) s wall"
}
{
  echo "# $(date -u +%F), $(nproc)-core VM; kvq study -m $model -f $text --json J --report R"
  study idle
  start_busy_core
  study busy
  stop_busy_core
  # The figures must not depend on timing: compare the two JSONs without
  # their timing, date and path fields, and print each run's stage times.
  python3 - "$tmp/idle.json" "$tmp/busy.json" <<'PY'
import json, sys
SKIP = {"seconds", "timings_seconds", "created_utc", "command", "end_to_end_dir"}
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in SKIP}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
runs = [json.load(open(p)) for p in sys.argv[1:]]
for label, run in zip(("idle", "busy"), runs):
    times = ", ".join(f"{k} {v:.1f}" for k, v in run["timings_seconds"].items())
    print(f"{label} stage seconds: {times}")
same = strip(runs[0]) == strip(runs[1])
print("idle and busy figures " + ("identical" if same else "DIFFER") + " (timing fields aside)")
PY
} | tee "$out"
rm -rf "$tmp"
