#!/usr/bin/env bash
# Issue 20 item 6's rule after session 19's ops change: vs_llamacpp 2 3, and
# old (session 17 binary) vs new kvq alternated on the real Q4_K 0.5B.
cd /work/main
pkill -STOP -f "bin-runs/kvq study"
echo "start $(date -u +%T) $(uptime)"
bench/vs_llamacpp.sh 2 3
m=.deps/models/qwen2.5-coder-0.5b-instruct.gguf
for round in 1 2 3; do
  for side in old new; do
    bin=build/bin/kvq; [ $side = old ] && bin=/work/logs/s19/kvq-s17
    echo "== round $round $side $(uptime | sed 's/.*load/load/')"
    $bin bench -m $m -t 2 --kv-cache-dtype f16 -p 512 -n 128 -r 3 > /work/logs/s20/ab-$side-$round.md
    grep -E "pp512|tg128" /work/logs/s20/ab-$side-$round.md
  done
done
echo "end $(date -u +%T) $(uptime)"
pkill -CONT -f "bin-runs/kvq study"
