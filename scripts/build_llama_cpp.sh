#!/usr/bin/env bash
# Builds llama.cpp (CPU only) from the source tree that scripts/setup.sh
# unpacked from node-llama-cpp@3.22.1, into a cache OUTSIDE the checkout so
# every clone and CI run on this machine reuses it. Then builds kvq's small
# harness (tools/llamacpp/harness.cc) against it.
#
#   scripts/build_llama_cpp.sh [target ...]   default: llama + harness
#   scripts/build_llama_cpp.sh --server       llama-server (bench/serve_vs_llamacpp.sh)
# Prints the cache's bin directory on the last line.
#
# llama-server needs LLAMA_BUILD_SERVER=ON (plus its vendored cpp-httplib and
# an empty web UI: LLAMA_BUILD_UI and LLAMA_USE_PREBUILT_UI off, so the
# build neither runs npm nor downloads the UI from Hugging Face). It is built
# in its own folder (build-server) with the same flags, so turning the
# server on never reconfigures, and never invalidates, the cached build the
# conformance tests use.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SRC="$ROOT/.deps/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || { echo "llama.cpp source missing: run scripts/setup.sh" >&2; exit 1; }
COMMIT=$(git -C "$SRC" rev-parse --short=12 HEAD)
# CPU flags: -march=native would also enable AMX on CPUs that advertise it,
# and on the project's VMs the AMX tiles fault (SIGILL in ggml's AMX q4_1
# matmul as soon as a quantized model runs). So on AVX-512 machines every
# x86 feature is named explicitly, AMX left out; elsewhere native.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
if has avx512f && has avx512bw && has avx512vl; then
  ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
       -DGGML_AVX512=ON)
  has avx512vbmi && ISA+=(-DGGML_AVX512_VBMI=ON)
  has avx512_vnni && ISA+=(-DGGML_AVX512_VNNI=ON)
  has avx512_bf16 && ISA+=(-DGGML_AVX512_BF16=ON)
  has avx_vnni && ISA+=(-DGGML_AVX_VNNI=ON)
  CONFIG=avx512-noamx
else
  ISA=(-DGGML_NATIVE=ON)
  CONFIG=native
fi
CACHE="${KVQ_CACHE_DIR:-/var/cache/kvq}/llama.cpp-$COMMIT-$CONFIG"
mkdir -p "$CACHE"
# The cache keeps its own copy of the source so it never depends on which
# clone built it.
if [ ! -f "$CACHE/src/CMakeLists.txt" ]; then
  rm -rf "$CACHE/src"
  git clone -q "$SRC" "$CACHE/src"
fi
COMMON=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF)
if [ "${1:-}" = "--server" ]; then
  if [ ! -f "$CACHE/build-server/CMakeCache.txt" ]; then
    cmake -S "$CACHE/src" -B "$CACHE/build-server" "${COMMON[@]}" -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF "${ISA[@]}" \
      >"$CACHE/configure-server.log" 2>&1 || { tail -30 "$CACHE/configure-server.log" >&2; exit 1; }
  fi
  cmake --build "$CACHE/build-server" --target llama-server >"$CACHE/build-server.log" 2>&1 \
    || { tail -30 "$CACHE/build-server.log" >&2; exit 1; }
  mkdir -p "$CACHE/bin"
  ln -sf "$CACHE/build-server/bin/llama-server" "$CACHE/bin/llama-server"
  echo "$CACHE/bin"
  exit 0
fi
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(llama)
if [ ! -f "$CACHE/build/CMakeCache.txt" ]; then
  cmake -S "$CACHE/src" -B "$CACHE/build" "${COMMON[@]}" -DLLAMA_BUILD_SERVER=OFF \
    "${ISA[@]}" >"$CACHE/configure.log" 2>&1 || { tail -30 "$CACHE/configure.log" >&2; exit 1; }
fi
cmake --build "$CACHE/build" --target "${TARGETS[@]}" >"$CACHE/build.log" 2>&1 \
  || { tail -30 "$CACHE/build.log" >&2; exit 1; }

# kvq's harness: rebuilt when its source is newer than the binary.
HARNESS_SRC="$ROOT/tools/llamacpp/harness.cc"
HARNESS_BIN="$CACHE/bin/kvq-llamacpp-harness"
mkdir -p "$CACHE/bin"
if [ ! -x "$HARNESS_BIN" ] || [ "$HARNESS_SRC" -nt "$HARNESS_BIN" ]; then
  libs=$(find "$CACHE/build" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
  g++ -O2 -std=c++17 -I"$CACHE/src/include" -I"$CACHE/src/ggml/include" \
    "$HARNESS_SRC" -o "$HARNESS_BIN.tmp" \
    -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl
  mv "$HARNESS_BIN.tmp" "$HARNESS_BIN"
fi
for t in "${TARGETS[@]}"; do
  [ -x "$CACHE/build/bin/$t" ] && ln -sf "$CACHE/build/bin/$t" "$CACHE/bin/$t"
done
echo "$CACHE/bin"
