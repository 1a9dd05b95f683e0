#!/usr/bin/env bash
# Conformance with llama.cpp on a real pretrained GGUF, over held-out text
# (f16 KV caches on both sides, the same windows: llama-perplexity's -c 512,
# second half of each window scored):
#   1. llama-perplexity writes its --kl-divergence-base file; kvq perplexity
#      reads it: mean KL(llama.cpp || kvq) <= 5e-4 nats, same top-1 >= 99.5%,
#      and the two perplexities within 0.5% relative;
#   2. kvq writes the same file format (--logits-format llama) in that run;
#      llama-perplexity --kl-divergence scores itself against it: the reverse
#      KL(kvq || llama.cpp) must also be <= 5e-4 and top-1 >= 99.5%.
# BARS=issue checks the issue's bars (make conformance-real). On quantized
# files they are out of reach for any implementation that is not bit-identical
# to this llama.cpp build: llama.cpp rounds every activation vector to 8 bits
# (q8_0/q8_1/q8_K) and that rounding re-draws itself under any change below
# f32 precision, so llama.cpp with flash attention off vs on is itself at
# KL 3.3e-3, same top-1 96.1% on SmolLM2 (docs/benchmarks.md "Real models").
# Issue mode therefore also measures that spread of llama.cpp against itself
# and checks that kvq is no further from llama.cpp than that.
# BARS=regression (make test) holds the agreement measured on SmolLM2 after
# the KL reader's fix (64 windows: KL(llama.cpp || kvq) 2.762e-3,
# KL(kvq || llama.cpp) 2.763e-3, top-1 96.28%, perplexity 0.37% apart) at
# 1.5x that KL and 0.8 point of top-1 below it. make test runs the first 16
# windows (4,080 positions, 2 minutes instead of 12): there KL(llama.cpp ||
# kvq) is 2.752e-3, KL(kvq || llama.cpp) 2.753e-3, top-1 96.10%, perplexity
# 0.21% apart, inside the same bars. llama.cpp's own spread
# (3.3e-3, 96.1%) lies inside these bars, and no correct kvq can be closer
# to llama.cpp than that. kvq's own forward pass is held to 1e-8 nats on the
# same weights decoded to f32 (conformance_tests RealF32.*), so what this
# guards is the file formats and the quantized kernels; a broken one moves
# the KL by far more. Figures go to WORK/NAME.summary.txt.
#   real_model_conformance.sh KVQ_BIN LLAMA_BIN_DIR MODEL.gguf TEXT WORK [CHUNKS] [BARS]
set -euo pipefail
kvq=$1
llama_bin=$2
model=$3
text=$4
work=$5
chunks=${6:-64}  # 64 windows x 256 scored = 16,320 positions
bars=${7:-issue}
case $bars in
  issue) max_kl=5e-4 min_top1=99.5 ;;
  regression) max_kl=4.2e-3 min_top1=95.5 ;;
  *) echo "bars must be issue or regression"; exit 2 ;;
esac
[ -f "$model" ] || { echo "SKIP: $model missing (run scripts/setup.sh)"; exit 77; }
[ -f "$text" ] || { echo "SKIP: $text missing (run scripts/setup.sh)"; exit 77; }
mkdir -p "$work"
name=$(basename "$model" .gguf)
llama_base="$work/$name.llama-base"
kvq_base="$work/$name.kvq-base"
threads=2

"$llama_bin/llama-perplexity" -m "$model" -f "$text" -c 512 -b 512 --chunks "$chunks" -t $threads \
  --kl-divergence-base "$llama_base" >"$work/$name.llama-ppl.log" 2>&1 \
  || { tail -20 "$work/$name.llama-ppl.log"; echo "FAIL: llama-perplexity failed"; exit 1; }
llama_ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$work/$name.llama-ppl.log")

self_kl="" self_top1=""
if [ "$bars" = issue ]; then  # llama.cpp against itself: flash attention off vs its default
  "$llama_bin/llama-perplexity" -m "$model" -c 512 -b 512 -t $threads -fa off \
    --kl-divergence-base "$llama_base" --kl-divergence >"$work/$name.llama-self.log" 2>&1 \
    || { tail -20 "$work/$name.llama-self.log"; echo "FAIL: llama-perplexity -fa off failed"; exit 1; }
  self_kl=$(sed -n 's/^Mean    KLD: *\([-0-9.e]*\).*/\1/p' "$work/$name.llama-self.log")
  self_top1=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$work/$name.llama-self.log")
fi

"$kvq" perplexity -m "$model" -f "$text" -c 512 -b 512 --chunks "$chunks" -t $threads \
  --kv-cache-dtype f16 --kl-divergence "$llama_base" \
  --save-logits "$kvq_base" --logits-format llama >"$work/$name.kvq-ppl.log" 2>&1 \
  || { tail -20 "$work/$name.kvq-ppl.log"; echo "FAIL: kvq perplexity failed"; exit 1; }
kvq_ppl=$(awk '$1 == "PPL:" {print $2}' "$work/$name.kvq-ppl.log")
kvq_kl=$(awk '$1 == "mean" && $2 == "KLD" {print $3}' "$work/$name.kvq-ppl.log")
kvq_top1=$(awk '$1 == "same" && $2 == "top-1" {print $3}' "$work/$name.kvq-ppl.log")
positions=$(sed -n 's/.*nats, \([0-9]*\) positions.*/\1/p' "$work/$name.kvq-ppl.log")

"$llama_bin/llama-perplexity" -m "$model" -c 512 -b 512 -t $threads \
  --kl-divergence-base "$kvq_base" --kl-divergence >"$work/$name.llama-kl.log" 2>&1 \
  || { tail -20 "$work/$name.llama-kl.log"; echo "FAIL: llama-perplexity --kl-divergence failed"; exit 1; }
rev_kl=$(sed -n 's/^Mean    KLD: *\([-0-9.e]*\).*/\1/p' "$work/$name.llama-kl.log")
rev_top1=$(sed -n 's/^Same top p: *\([0-9.]*\).*/\1/p' "$work/$name.llama-kl.log")

for v in llama_ppl kvq_ppl kvq_kl kvq_top1 rev_kl rev_top1 positions; do
  [ -n "${!v}" ] || { echo "FAIL: could not read $v from the logs in $work"; exit 1; }
done
ppl_rel=$(awk -v a="$kvq_ppl" -v b="$llama_ppl" 'BEGIN {d = (a - b) / b; if (d < 0) d = -d; printf "%.5f", d}')
{
  echo "model $name, $positions positions, $chunks windows of 512 (threads $threads)"
  echo "PPL: llama.cpp $llama_ppl, kvq $kvq_ppl (relative difference $ppl_rel)"
  echo "KL(llama.cpp || kvq) mean $kvq_kl nats, same top-1 $kvq_top1 %"
  echo "KL(kvq || llama.cpp) mean $rev_kl nats, same top-1 $rev_top1 % (computed by llama-perplexity)"
  [ -z "$self_kl" ] || echo "llama.cpp flash attention off vs on: KL mean $self_kl nats, same top-1 $self_top1 %"
} | tee "$work/$name.summary.txt"

fail=0
check() {  # description condition
  if awk "BEGIN {exit !($2)}"; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi
}
[ "$positions" -ge 16000 ] || [ "$chunks" -lt 64 ] || { echo "FAIL: only $positions positions"; fail=1; }
[ "$positions" -ge 16000 ] || echo "note: $positions positions (fewer than the issue's 16K: CHUNKS=$chunks)"
check "perplexity within 0.5% ($ppl_rel)" "$ppl_rel <= 0.005"
check "KL(llama.cpp || kvq) <= $max_kl ($kvq_kl)" "$kvq_kl <= $max_kl"
check "same top-1 >= $min_top1% ($kvq_top1)" "$kvq_top1 >= $min_top1"
check "KL(kvq || llama.cpp) <= $max_kl ($rev_kl)" "$rev_kl <= $max_kl"
check "llama.cpp's same top-1 >= $min_top1% ($rev_top1)" "$rev_top1 >= $min_top1"
if [ -n "$self_kl" ]; then
  check "KL(llama.cpp || kvq) within llama.cpp's own spread ($kvq_kl <= $self_kl)" "$kvq_kl <= $self_kl"
  # top-1 rates carry a sampling error of ~0.15 point at 16K positions (0.9
  # at 512): one point of slack keeps the check from failing on noise.
  check "same top-1 within llama.cpp's own spread ($kvq_top1 >= $self_top1 - 1)" \
    "$kvq_top1 >= $self_top1 - 1"
fi
echo "bars: $bars"
# The two baselines are n_vocab x 2 bytes per position (1.6 GB for SmolLM2).
rm -f "$llama_base" "$kvq_base"
exit $fail
