#!/usr/bin/env bash
# Opens the study's HTML report in headless Chromium (Debian's `chromium`) and
# checks that it works offline: every chart rendered as SVG with marks, no
# error or warning recorded by the page, a non-blank screenshot.
#
#   chromium_report_test.sh [--chromium PATH] [--render RENDERER] INPUT
#   chromium_report_test.sh [--chromium PATH] --report-cmd "COMMAND WORDS"
#
# INPUT is either a report (.html), checked as it is, or a study JSON (.json),
# rendered first with RENDERER (render_study_report STUDY.json OUT.html). A
# JSON input is also re-rendered with hostile strings planted in every
# free-text field, and that page must pass the same checks with the strings
# shown as plain text. --report-cmd runs COMMAND WORDS with the report path
# appended (e.g. "kvq study --quick --report") and checks what it wrote.
#
# Chromium runs bounded (timeout), with a throw-away profile, no extensions,
# no background networking; the page's Content Security Policy forbids any
# fetch, so a report that needed the network would record an error.
# Exit 0 pass, 1 fail, 77 skip (no chromium).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CHROMIUM=$(command -v chromium || true)
RENDER=""
REPORT_CMD=""
while [ $# -gt 1 ]; do
  case "$1" in
    --chromium) CHROMIUM=$2; shift 2 ;;
    --render) RENDER=$2; shift 2 ;;
    --report-cmd) REPORT_CMD=$2; shift 2 ;;
    *) break ;;
  esac
done
if [ -n "$REPORT_CMD" ] && [ $# -eq 0 ]; then
  INPUT=--report-cmd
elif [ -z "$REPORT_CMD" ] && [ $# -eq 1 ]; then
  INPUT=$1
else
  sed -n '2,20p' "$0"
  exit 2
fi
if [ -z "$CHROMIUM" ] || [ ! -x "$CHROMIUM" ]; then
  echo "SKIP: chromium not found (scripts/setup.sh installs Debian's chromium)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvq-report-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PYTHON=/usr/bin/python3  # Debian's, with python3-matplotlib
CHECK="$HERE/check_report.py"

# run_chromium dom|screenshot OUTPUT HTML: one bounded, hermetic Chromium run
# (a screenshot is $height px tall).
# Virtual time lets the page's scripts and promises finish without waiting
# real seconds; the timeout bounds a hung browser.
run_chromium() {
  local mode=$1 out=$2 html=$3 profile
  profile=$(mktemp -d "$WORK/profile.XXXXXX")
  local flags=(--headless --no-sandbox --disable-gpu --user-data-dir="$profile"
    --no-first-run --no-default-browser-check --disable-extensions --disable-sync
    --disable-background-networking --disable-component-update --disable-default-apps
    --mute-audio --hide-scrollbars --virtual-time-budget=60000)
  # Both runs are 1400 px wide, so the chart boxes the page records in the
  # DOM run are where the charts are in the screenshot.
  if [ "$mode" = dom ]; then
    timeout 240 "$CHROMIUM" "${flags[@]}" --window-size=1400,1000 --dump-dom "file://$html" \
      >"$out" 2>"$out.log"
  else
    timeout 240 "$CHROMIUM" "${flags[@]}" --window-size="1400,$height" --screenshot="$out" \
      "file://$html" >"$out.log" 2>&1
  fi
  local rc=$?
  rm -rf "$profile"
  return $rc
}

passed=0
failed=0
# check_html NAME HTML [check_report.py dom options]
check_html() {
  local name=$1 html=$2
  shift 2
  echo "== $name: $html ($(stat -c %s "$html") bytes)"
  if run_chromium dom "$WORK/$name.dom.html" "$html" &&
    "$PYTHON" "$CHECK" dom "$WORK/$name.dom.html" "$@"; then
    echo "ok: $name: page self-check and SVG charts"
    passed=$((passed + 1))
  else
    echo "FAILED: $name: page self-check or SVG charts (chromium log below)"
    tail -n 20 "$WORK/$name.dom.html.log" || true
    failed=$((failed + 1))
  fi
  # The whole page in one screenshot (the height the page recorded, at most
  # 16000 px; a chart below that would fail as outside the screenshot).
  height=$("$PYTHON" "$CHECK" page-height "$WORK/$name.dom.html" 2>/dev/null || echo 0)
  [ "$height" -ge 600 ] 2>/dev/null || height=600
  [ "$height" -le 16000 ] || height=16000
  if run_chromium screenshot "$WORK/$name.png" "$html" &&
    "$PYTHON" "$CHECK" screenshot "$WORK/$name.png" "$WORK/$name.dom.html"; then
    echo "ok: $name: screenshot not blank"
    passed=$((passed + 1))
  else
    echo "FAILED: $name: screenshot"
    tail -n 20 "$WORK/$name.png.log" || true
    failed=$((failed + 1))
  fi
}

case "$INPUT" in
  --report-cmd)
    read -ra words <<<"$REPORT_CMD"
    "${words[@]}" "$WORK/report.html"
    check_html report "$WORK/report.html"
    ;;
  *.html)
    check_html report "$(realpath "$INPUT")"
    ;;
  *.json)
    [ -n "$RENDER" ] || { echo "a .json input needs --render RENDERER" >&2; exit 2; }
    "$RENDER" "$INPUT" "$WORK/report.html"
    check_html report "$WORK/report.html" --study "$INPUT"
    "$PYTHON" "$CHECK" hostile "$INPUT" "$WORK/hostile.json"
    "$RENDER" "$WORK/hostile.json" "$WORK/hostile.html"
    check_html hostile "$WORK/hostile.html" --study "$WORK/hostile.json" --hostile
    ;;
  *)
    echo "INPUT must be a .html report or a .json study: $INPUT" >&2
    exit 2
    ;;
esac
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
