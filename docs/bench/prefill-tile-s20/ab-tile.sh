#!/usr/bin/env bash
cd /work/logs/s20
pkill -STOP -f "bin-runs/kvq study"
echo "start $(date -u +%T) $(uptime | sed 's/.*load/load/')"
f='^MatmulPacked/f32/(4864x896|896x4864)/n:512/threads:(1|2)|^Prefill/MatmulPacked/q4_k/896x4864/n:512'
for r in 1 2 3 4 5; do
  for b in old 6x2; do
    ./ops_bench-$b --benchmark_filter="$f" --benchmark_min_time=0.5 --benchmark_format=json 2>/dev/null > $b-$r.json
    ./kvq-$b bench -m /work/main/.deps/models/qwen2.5-coder-0.5b-instruct.gguf -t 2 --kv-cache-dtype f16 -p 512 -n 0 -r 3 | grep pp512 > $b-$r.bench.md
  done
done
echo "end $(date -u +%T) $(uptime | sed 's/.*load/load/')"
pkill -CONT -f "bin-runs/kvq study"
