#!/usr/bin/env bash
# No binary may hold AVX-VNNI's VEX-encoded dot products ("{vex} vpdpbusd",
# vpdpwssd, ...): no Highway target kvq compiles for includes AVX-VNNI, and
# CPUs with AVX512-VNNI but without AVX-VNNI (AMD Zen 4) fault on them with
# SIGILL. GCC 12 emits them for the AVX512-VNNI intrinsics on ymm registers,
# so the kernels use the EVEX form explicitly (src/ops/quant_dot-inl.h); this
# catches a new intrinsic that brings the VEX form back, on any build machine.
#   no_avx_vnni_test.sh BINARY...
set -euo pipefail
status=0
for binary in "$@"; do
  hits=$(objdump -d --no-show-raw-insn "$binary" | grep '{vex} *vpdp' || true)
  if [ -n "$hits" ]; then
    echo "FAIL: $binary holds $(wc -l <<<"$hits") VEX-encoded VNNI instructions (AVX-VNNI):" >&2
    sed -n 1,5p <<<"$hits" >&2
    status=1
  else
    echo "ok: $binary has no AVX-VNNI instructions"
  fi
done
exit $status
