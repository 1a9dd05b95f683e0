#!/bin/bash
# Issue 21 from the command line, against the real kvq binary: every file
# input is a bounded regular file, numeric flags are range-checked, and
# `kvq serve` refuses a port in use, serves with --max-waiting 0, takes the
# README's curl form (form-encoded, > 8 KB) and an API key from a file that
# it never prints. Each check runs under a time and memory bound, so the old
# failures (unbounded reads, crashes, hangs) fail here instead of hurting
# the machine.
# Usage: hardening_cli_test.sh KVQ_BINARY MODEL_DIR WORK_DIR
set -u
KVQ=$1 MODEL=$2 WORK=$3
if [ ! -f "$MODEL/config.json" ]; then echo "skip: default model missing"; exit 77; fi
rm -rf "$WORK" && mkdir -p "$WORK"
export OMP_WAIT_POLICY=PASSIVE
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# bounded SECONDS CMD...: at most SECONDS and 3 GB of address space. An
# ASan build reserves terabytes of shadow address space at start-up, so there
# the address-space bound is left out (ASan itself reports runaway memory).
if ldd "$KVQ" 2>/dev/null | grep -q libasan; then address_limit=unlimited
else address_limit=3000000; fi
bounded() {
  secs=$1; shift
  (ulimit -v "$address_limit"; timeout "$secs" "$@")
}

# expect_error NAME MESSAGE_PART CMD...: exits 1 (not a signal, not a
# timeout) with MESSAGE_PART on stderr.
expect_error() {
  name=$1 want=$2; shift 2
  bounded 30 "$@" >"$WORK/out" 2>"$WORK/err"
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then
    fail "$name: exit $rc (want an error exit): $(tail -c 300 "$WORK/err")"
  elif ! grep -qi -- "$want" "$WORK/err"; then
    fail "$name: stderr lacks '$want': $(tail -c 300 "$WORK/err")"
  else
    pass "$name"
  fi
}

# Failure 4: devices, FIFOs and directories are refused before reading.
expect_error "perplexity -f /dev/zero" "not a regular file" "$KVQ" perplexity -m "$MODEL" -f /dev/zero -t 1
expect_error "perplexity -f /dev/urandom" "not a regular file" "$KVQ" perplexity -m "$MODEL" -f /dev/urandom -t 1
mkfifo "$WORK/fifo"
expect_error "perplexity -f FIFO" "FIFO" "$KVQ" perplexity -m "$MODEL" -f "$WORK/fifo" -t 1
expect_error "generate -m FIFO" "FIFO" "$KVQ" generate -m "$WORK/fifo" -p hi -n 1 -t 1
mkdir -p "$WORK/policy-dir"
expect_error "--kv-policy DIR" "directory" "$KVQ" generate -m "$MODEL" -p hi -n 1 -t 1 --kv-policy "$WORK/policy-dir"

# Failure 6: numeric flags are range-checked, non-finite values included.
expect_error "generate -t 100000" "threads" "$KVQ" generate -m "$MODEL" -p hi -n 1 -t 100000
expect_error "serve -t 100000" "threads" "$KVQ" serve -m "$MODEL" --port 0 -t 100000
expect_error "generate --temp nan" "finite" "$KVQ" generate -m "$MODEL" -p hi -n 1 --temp nan
expect_error "generate --top-p inf" "finite" "$KVQ" generate -m "$MODEL" -p hi -n 1 --top-p inf
expect_error "serve --shutdown-timeout nan" "finite" "$KVQ" serve -m "$MODEL" --port 0 --shutdown-timeout nan
# --batch-invariant: a chunk that cannot fit beside a full batch, a chunk
# without the mode, and a cache whose fp8 scales the first request sets.
expect_error "serve --prefill-chunk 500" "at most max_num_batched_tokens - max_num_seqs (496)" \
  "$KVQ" serve -m "$MODEL" --port 0 -t 1 --batch-invariant --prefill-chunk 500
expect_error "serve --prefill-chunk alone" "requires --batch-invariant" \
  "$KVQ" serve -m "$MODEL" --port 0 -t 1 --prefill-chunk 64
expect_error "serve --batch-invariant fp8" "scales from the first rows it stores" \
  "$KVQ" serve -m "$MODEL" --port 0 -t 1 --batch-invariant --kv-cache-dtype fp8_e4m3
expect_error "generate --prefill-chunk 0" "prefill-chunk" \
  "$KVQ" generate -m "$MODEL" -p hi -n 1 -t 1 --batch-invariant --prefill-chunk 0
# --simd-target: an unknown target is refused; a cap takes effect whether it
# comes before or after the subcommand. The cap is the worst target on offer
# (SCALAR in make test's build; the sanitizer build compiles only this CPU's).
expect_error "--simd-target NOPE" "not available" "$KVQ" --simd-target NOPE info "$MODEL"
worst=$(bounded 30 "$KVQ" info "$MODEL" | sed -n 's/^kernels: .*this CPU and build: \(.*\))$/\1/p' |
  awk -F', ' '{print $NF}')
if [ -z "$worst" ]; then fail "kvq info names no SIMD targets"; fi
for where in before after; do
  if [ $where = before ]; then args=(--simd-target "$worst" info "$MODEL")
  else args=(info "$MODEL" --simd-target "$worst"); fi
  if [ -n "$worst" ] && bounded 30 "$KVQ" "${args[@]}" 2>&1 | grep -q "SIMD target $worst "; then
    pass "--simd-target $worst $where the subcommand"
  else fail "--simd-target '$worst' $where the subcommand: info does not report it"; fi
done

# start_server LOG ARGS...: starts kvq serve on a free port; sets PID, PORT.
start_server() {
  log=$1; shift
  "$KVQ" serve -m "$MODEL" --port 0 -t 1 "$@" >"$log.out" 2>"$log.err" &
  PID=$!
  PORT=""
  for _ in $(seq 1 300); do
    PORT=$(sed -n 's|.*listening on http://[^:]*:\([0-9]*\).*|\1|p' "$log.out" 2>/dev/null)
    [ -n "$PORT" ] && return 0
    kill -0 $PID 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
stop_server() { kill -TERM "$PID" 2>/dev/null; wait "$PID"; }

printf 'k3y-%s\n' "$RANDOM$RANDOM" >"$WORK/key"
KEY=$(head -n 1 "$WORK/key")
if ! start_server "$WORK/serve" --max-waiting 0 --api-key-file "$WORK/key"; then
  fail "kvq serve did not start: $(cat "$WORK/serve.err")"
else
  # Failure 3: a second server on the same port fails with "in use", exit 1.
  bounded 60 "$KVQ" serve -m "$MODEL" --port "$PORT" -t 1 >"$WORK/second.out" 2>"$WORK/second.err"
  rc=$?
  if [ $rc -ne 1 ] || ! grep -q "in use" "$WORK/second.err"; then
    fail "second serve on port $PORT: exit $rc: $(tail -c 300 "$WORK/second.err")"
  else
    pass "second serve on a port in use"
  fi
  # Failure 6: --max-waiting 0 serves an idle server. Failure 5: the
  # README's curl form (no JSON content type) with a body over 8 KB.
  pad=$(head -c 9000 /dev/zero | tr '\0' 'u')
  code=$(curl -s -o "$WORK/curl.json" -w '%{http_code}' "127.0.0.1:$PORT/v1/chat/completions" \
    -H "Authorization: Bearer $KEY" \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "user": "'"$pad"'"}')
  [ "$code" = 200 ] && pass "curl -d, 9 KB, --max-waiting 0" ||
    fail "curl -d, 9 KB, --max-waiting 0: HTTP $code $(head -c 300 "$WORK/curl.json")"
  code=$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$PORT/v1/models")
  [ "$code" = 401 ] && pass "no key: 401" || fail "no key: HTTP $code"
  stop_server
  # The key from the file is never printed.
  if grep -q "$KEY" "$WORK/serve.out" "$WORK/serve.err"; then
    fail "the API key appears in the server's output"
  else
    pass "API key not printed"
  fi
fi

[ $failures -eq 0 ] && echo "all passed" || echo "$failures FAILED"
[ $failures -eq 0 ]
