#!/usr/bin/env bash
# The Python environment for the peer rows of bench/quality_peers.sh (Hugging
# Face transformers' QuantizedCache with the optimum-quanto backend): a venv at
# .deps/venv-peers/ built from scripts/requirements-peers.txt, every wheel
# pinned and checked against its sha256. CPU-only: torch's CUDA runtime
# packages (nvidia-*, cuda-*, triton) are left out of the pinned set and
# everything is installed with --no-deps, so pip cannot pull them back in.
# kvq itself needs none of this; only the peers benchmark does.
#
#   scripts/setup_peers.sh [--check]
# --check: exit 0 when the venv exists and imports the pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.deps/venv-peers
wheels=.deps/download/peers-wheels
req=scripts/requirements-peers.txt
stamp=$venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)

check() {
  [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] &&
    "$venv/bin/python" -c 'import torch, transformers, optimum.quanto, gguf' 2>/dev/null
}
if [ "${1:-}" = "--check" ]; then check; exit; fi
if check; then echo "$venv: up to date"; exit 0; fi

python=${PYTHON:-python3}
case "$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" in
  3.11) ;;
  *) echo "setup_peers: $req is resolved for CPython 3.11; $python is not" >&2; exit 1 ;;
esac
mkdir -p "$wheels"
echo "setup_peers: downloading the pinned wheels into $wheels"
"$python" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
  -d "$wheels" -r "$req"
rm -rf "$venv"
"$python" -m venv "$venv"
echo "setup_peers: installing into $venv (no network: from $wheels only)"
"$venv/bin/pip" install --quiet --no-index --find-links "$wheels" --no-deps --require-hashes \
  -r "$req"
echo "$want" > "$stamp"
"$venv/bin/python" -c 'import torch, transformers, optimum.quanto as q; print("torch", torch.__version__, "transformers", transformers.__version__, "optimum-quanto", q.__version__)'
