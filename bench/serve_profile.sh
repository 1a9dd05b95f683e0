#!/usr/bin/env bash
# Profiles `kvq serve` through one cell of bench/serve_vs_llamacpp.sh: the
# cell runs as usual while `perf record` (cpu-clock: the only event a VM
# without PMU access has) samples the server, and the samples are reported by
# symbol into OUT/kvq-TYPE.perf.txt beside the cell's OUT/kvq-TYPE-cC.json.
# bench/serve_profile.py sums them into what the server spends its time on.
#
#   bench/serve_profile.sh OUT TYPE [CONCURRENCY [REQUESTS]]   (default 64 64)
#
# Run it on an otherwise idle machine; the cell's options are the script's
# defaults (SmolLM2-135M Q4_1, 256 MiB of KV memory, 2 threads).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?OUT directory}
type=${2:?KV cache type, e.g. f16 or int4}
level=${3:-64}
count=${4:-64}
command -v perf > /dev/null || { echo "serve_profile: perf is required (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$out"
bench/serve_vs_llamacpp.sh --servers "kvq-$type" --concurrency "$level" --requests "$count" \
  --out "$out" > "$out/kvq-$type.run.log" 2>&1 &
runner=$!
pid=
for _ in $(seq 1 600); do
  pid=$(pgrep -f "kvq serve -m .* --kv-cache-dtype $type " | head -n 1 || true)
  [ -n "$pid" ] && break
  sleep 0.1
done
[ -n "$pid" ] || { echo "serve_profile: kvq serve did not start (see $out/kvq-$type.run.log)" >&2; exit 1; }
perf record -e cpu-clock -F 499 -p "$pid" -o "$out/kvq-$type.perf.data" > /dev/null 2>&1 &
wait "$runner"
sleep 1
perf report -i "$out/kvq-$type.perf.data" --no-children --sort symbol -g none --stdio \
  --percent-limit 0.01 2> /dev/null | grep '%' | sed 's/ *$//' > "$out/kvq-$type.perf.txt"
rm -f "$out/kvq-$type.perf.data" "$out/corpus.ids"
echo "serve_profile: $out/kvq-$type.perf.txt"
