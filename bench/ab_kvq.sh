#!/usr/bin/env bash
# Before/after: `kvq bench` of another revision (BASE) against this tree's
# build, alternated round by round on the same model, so a change to ops/ or
# kv/ is judged by same-run ratios on this machine, not against figures from
# another day or machine (issue 20: a merge that touches ops/ or kv/ runs this
# and bench/vs_llamacpp.sh first).
#
#   bench/ab_kvq.sh BASE [ROUNDS] [MODEL] [-- extra kvq bench args]
# Defaults: 3 rounds, the synthetic Qwen2.5-0.5B F16 GGUF of bench/vs_llamacpp.sh,
# `-t 2 --kv-cache-dtype f16 -p 512 -n 128 -r 3`.
# BASE is built (kvq only) in a git worktree under build/ab/<commit>/, reused
# by later runs. Needs: make build.
set -euo pipefail
cd "$(dirname "$0")/.."
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
args=("$@")
base=${positional[0]:?usage: bench/ab_kvq.sh BASE [ROUNDS] [MODEL] [-- kvq bench args]}
rounds=${positional[1]:-3}
model=${positional[2]:-build/bench/qwen2.5-0.5b-f16.gguf}
[ ${#args[@]} -gt 0 ] || args=(-t 2 --kv-cache-dtype f16 -p 512 -n 128 -r 3)
kvq=build/bin/kvq
commit=$(git rev-parse --short=12 "$base^{commit}")
src=build/ab/$commit
if [ ! -x "$src/build/bin/kvq" ]; then
  [ -d "$src" ] || git worktree add --detach "$src" "$commit" >/dev/null
  [ -e "$src/.deps" ] || ln -s "$(pwd)/.deps" "$src/.deps"
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$src/build" -j "$(nproc)" --target kvq >/dev/null
fi
if [ "$model" = build/bench/qwen2.5-0.5b-f16.gguf ] && [ ! -f "$model" ]; then
  mkdir -p build/bench
  "$kvq" synth --preset qwen2.5-0.5b --vocab .deps/llama.cpp/models/ggml-vocab-qwen2.gguf \
    --dtype f16 --seed 1 -o "$model"
fi
out=build/ab/results-$commit-$(date -u +%Y%m%dT%H%M%S)
mkdir -p "$out"
echo "base $commit vs $(git rev-parse --short=12 HEAD)$(git diff --quiet || echo '+dirty'); model $model; kvq bench ${args[*]}"
for round in $(seq 1 "$rounds"); do
  for side in base head; do
    bin=$kvq
    [ "$side" = base ] && bin=$src/build/bin/kvq
    echo "== round $round $side ($(uptime | sed 's/.*load/load/'))"
    "$bin" bench -m "$model" "${args[@]}" > "$out/$side-$round.md"
  done
done
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def read(path):
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and re.match(r"(pp|tg)\d+", cells[6]):
            rows[cells[6]] = float(cells[7].split("±")[0])
    return rows
runs = [(read(f"{out}/base-{r}.md"), read(f"{out}/head-{r}.md")) for r in range(1, rounds + 1)]
print("\n| test | base t/s (rounds) | head t/s (rounds) | head / base per round | median |")
print("| --- | --- | --- | --- | ---: |")
for test in runs[0][0]:
    b = [r[0][test] for r in runs]
    h = [r[1][test] for r in runs]
    ratios = [y / x for x, y in zip(b, h)]
    print(f"| {test} | {' '.join(f'{v:.1f}' for v in b)} | {' '.join(f'{v:.1f}' for v in h)} | "
          f"{' '.join(f'{v:.2f}' for v in ratios)} | {statistics.median(ratios):.2f} |")
PY
