#!/usr/bin/env bash
# End to end: 40 GSM8K answers decoding together on the 0.5B (Q4_K_M), 64 new
# tokens each: steps of 40 rows, the GEMM before the routing change, the
# integer tiles after. Old then new, twice; core study paused.
cd /work/main
pkill -STOP -f "bin-runs/kvq study"
echo "start $(date -u +%T) $(uptime | sed 's/.*load/load/')"
for r in 1 2; do
  for side in old new; do
    bin=build/bin/kvq; [ $side = old ] && bin=/work/logs/s20/kvq-6x2
    rm -rf /tmp/route-$side-$r
    s=$(date +%s.%N)
    $bin study -m .deps/models/qwen2.5-coder-0.5b-instruct.gguf -t 2 --no-core \
      --results-dir /tmp/route-$side-$r --json /tmp/route-$side-$r.json --gsm8k-problems 40 \
      --gsm8k-schemes f16 --gsm8k-batch 40 --gsm8k-max-tokens 64 > /tmp/route-$side-$r.log 2>&1
    e=$(date +%s.%N)
    echo "round $r $side $(echo "$e - $s" | bc) s $(grep -E '^f16 ' /tmp/route-$side-$r.log)"
  done
done
echo "end $(date -u +%T) $(uptime | sed 's/.*load/load/')"
pkill -CONT -f "bin-runs/kvq study"
