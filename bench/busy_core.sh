# Sourced by the load benchmarks (bench/pool_wait.sh, bench/study_under_load.sh):
# one core kept busy by a one-thread spin loop in its own session (setsid).
# With the kernel's autogroup scheduling, as on Debian, CPU time is shared
# between sessions first, so this is what another user's job or a service
# does to kvq.
#   start_busy_core   starts it, sets busy_pid, prints a '# busy: ...' line
#   stop_busy_core    stops it; it also stops itself once the sourcing
#                     script's process ($$) is gone, however that ends
busy_pid=
start_busy_core() {
  local pidfile
  pidfile=$(mktemp)
  setsid bash -c 'echo $$ > "$0"; i=0
    while :; do i=$((i + 1)); if ((i % 100000 == 0)); then kill -0 "$1" 2>/dev/null || exit; fi; done' \
    "$pidfile" "$$" &
  sleep 1
  busy_pid=$(cat "$pidfile")
  rm -f "$pidfile"
  echo "# busy: spin loop pid $busy_pid, $(cat "/proc/$busy_pid/autogroup")"
}
stop_busy_core() {
  if [ -n "$busy_pid" ]; then kill "$busy_pid" 2>/dev/null || true; fi
  busy_pid=
}
