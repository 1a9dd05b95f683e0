#!/usr/bin/env bash
# Batch invariance on a real model, and what it costs: 64 GSM8K answers on
# the 0.5B (Q4_K_M), 64 new tokens each, two threads, the long-run lanes
# paused. kvq-s42 decodes batched steps with ops::Matmul's routing
# (BatchArith::kFastest), kvq-s43 (51572b8) with ops::MatmulRowwise
# (kInvariant). Timing: 64 answers decoding together, old then new, twice.
# Invariance: each binary again with 4 answers at a time; the answer files
# are compared.
set -u
cd /work/main
out=docs/bench/batch-invariant-s43
old=/work/bin-runs/kvq-s42 new=/work/bin-runs/kvq-s43
run() {  # run LABEL BIN BATCH
  rm -rf /tmp/bi-$1
  local s e
  s=$(date +%s.%N)
  $2 --simd-target AVX3 study -m .deps/models/qwen2.5-coder-0.5b-instruct.gguf -t 2 --no-core \
    --results-dir /tmp/bi-$1 --json /tmp/bi-$1.json --gsm8k-problems 64 --gsm8k-schemes f16 \
    --gsm8k-batch $3 --gsm8k-max-tokens 64 > /tmp/bi-$1.log 2>&1
  e=$(date +%s.%N)
  echo "$1 $(echo "$e - $s" | bc) s"
}
/work/logs/s43/pause.sh STOP
echo "start $(date -u +%T) $(uptime | sed 's/.*load/load/')"
for r in 1 2; do
  run old-b64-$r $old 64
  run new-b64-$r $new 64
done
run old-b4 $old 4
run new-b4 $new 4
echo "end $(date -u +%T) $(uptime | sed 's/.*load/load/')"
/work/logs/s43/pause.sh CONT
# Each answer file sorted by problem (batched runs record in finishing order).
for l in old-b64-1 old-b64-2 old-b4 new-b64-1 new-b64-2 new-b4; do
  python3 -c "
import json,sys
rs=sorted((json.loads(x) for x in open(sys.argv[1])), key=lambda r: r['index'])
print('\n'.join(json.dumps({'index': r['index'], 'answer': r['answer']}) for r in rs))" \
    /tmp/bi-$l/gsm8k/f16-*.jsonl > $out/$l.answers.jsonl
done
for pair in "old-b64-1 old-b64-2" "old-b64-1 old-b4" "new-b64-1 new-b64-2" "new-b64-1 new-b4" \
            "old-b4 new-b4" "old-b64-1 new-b64-1"; do
  set -- $pair
  same=$(python3 -c "
import json,sys
a=[json.loads(x)['answer'] for x in open(sys.argv[1])]
b=[json.loads(x)['answer'] for x in open(sys.argv[2])]
print(sum(x==y for x,y in zip(a,b)), '/', len(a))" $out/$1.answers.jsonl $out/$2.answers.jsonl)
  echo "same text $1 vs $2: $same"
done
