#!/usr/bin/env python3
"""Soak test of `kvq serve` (issue 21): for a bounded time, on loopback, a
mix of well-formed, malformed, slow and disconnecting clients at the given
concurrency against a small --kv-memory. Passes when the server never
crashes, every well-formed request is answered correctly, no KV block is
leaked at the end (/metrics), RSS stays bounded and SIGTERM exits 0.
Prints a summary table (markdown) and optionally writes it as JSON.

Usage: soak_test.py KVQ MODEL_DIR [--seconds 90] [--concurrency 64]
                    [--kv-memory 512K] [--json out.json]
Standard library only (kvq needs no Python; this is a test client)."""

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

PROMPTS = ["Hello", "Once upon a time", "The capital of France is", "1, 2, 3,", "def f(x):"]


def connect(port, timeout=30.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(sock):
    """One HTTP response: (status, headers, body); status -1 on close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return -1, {}, b""
        data += chunk
        while data.startswith(b"HTTP/1.1 1") and b"\r\n\r\n" in data:  # 100 Continue
            data = data[data.index(b"\r\n\r\n") + 4:]
    head, rest = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return status, headers, rest[:n]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                chunk = sock.recv(65536)
                if not chunk:
                    return status, headers, None
                rest += chunk
            size_line, rest = rest.split(b"\r\n", 1)
            size = int(size_line, 16)
            while len(rest) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    return status, headers, None
                rest += chunk
            body += rest[:size]
            rest = rest[size + 2:]
            if size == 0:
                return status, headers, body
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return status, headers, rest
        rest += chunk


def post(path, body, extra=""):
    text = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(text)}\r\n\r\n").encode() + text


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.errors = []
        self.health = []

    def add(self, kind, ok, detail=""):
        with self.lock:
            c = self.counts.setdefault(kind, [0, 0])
            c[0] += 1
            if not ok:
                c[1] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{kind}: {detail}")


def check_completion(status, body, chat, max_tokens, expect_prompt_tokens):
    if status != 200:
        return f"HTTP {status} {body[:200]!r}"
    j = json.loads(body)
    choice = j["choices"][0]
    if choice["finish_reason"] not in ("stop", "length"):
        return f"finish_reason {choice['finish_reason']}"
    text = choice["message"]["content"] if chat else choice["text"]
    if not isinstance(text, str):
        return "no text"
    usage = j["usage"]
    if usage["completion_tokens"] > max_tokens or usage["completion_tokens"] < 0:
        return f"completion_tokens {usage['completion_tokens']} > {max_tokens}"
    if choice["finish_reason"] == "length" and usage["completion_tokens"] != max_tokens:
        return "length finish before max_tokens"
    if expect_prompt_tokens is not None and usage["prompt_tokens"] != expect_prompt_tokens:
        return f"prompt_tokens {usage['prompt_tokens']} != {expect_prompt_tokens}"
    return None


def well_formed(port, rng, stats, prompt_tokens):
    prompt = rng.choice(PROMPTS)
    max_tokens = rng.randint(1, 16)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    with connect(port, 120) as s:
        s.sendall(post("/v1/completions", body))
        status, _, data = read_response(s)
    err = check_completion(status, data, False, max_tokens, prompt_tokens.get(prompt))
    stats.add("well-formed completion", err is None, err or "")


def well_formed_stream(port, rng, stats):
    max_tokens = rng.randint(1, 16)
    body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with connect(port, 120) as s:
        s.sendall(post("/v1/chat/completions", body))
        status, _, data = read_response(s)
    err = None
    if status != 200 or data is None:
        err = f"HTTP {status}"
    else:
        events = [e[6:] for e in data.decode().split("\n\n") if e.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            err = "stream did not end with [DONE]"
        else:
            chunks = [json.loads(e) for e in events[:-1]]
            usage = chunks[-1].get("usage")
            reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
            if usage is None or usage["completion_tokens"] > max_tokens:
                err = f"bad usage {usage}"
            elif reasons[-1] not in ("stop", "length"):
                err = f"finish_reason {reasons[-1]}"
    stats.add("well-formed stream", err is None, err or "")


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{bad}",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Length: 3\r\n\r\n0\r\n\r\n",
    b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    post("/v1/completions", {"prompt": "x", "best_of": 3}),
    post("/v1/completions", {"prompt": "x", "logit_bias": {"999999": 1}}),
    post("/v1/completions", {"prompt": "x", "temperature": "hot"}),
    post("/v1/completions", {"prompt": [1] * 2000}),
    post("/v1/chat/completions", {"messages": []}),
]


def malformed(port, rng, stats):
    request = rng.choice(MALFORMED)
    with connect(port, 30) as s:
        s.sendall(request)
        status, _, _ = read_response(s)
    ok = 400 <= status < 600
    stats.add("malformed", ok, f"HTTP {status} for {request[:60]!r}")


def slow(port, rng, stats):
    """Sends a request a few bytes at a time; either finishes it (must be
    answered) or stalls until the server's head deadline cuts it."""
    finish = rng.random() < 0.5
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 20 + b"\r\n\r\n"
    with connect(port, 60) as s:
        cut = len(request) if finish else len(request) - 4
        for i in range(0, cut, 8):
            s.sendall(request[i:min(i + 8, cut)])
            time.sleep(0.2)
        status, _, _ = read_response(s)
    ok = status == 200 if finish else status in (408, -1)
    stats.add("slow (finished)" if finish else "slow (stalled)", ok, f"HTTP {status}")


def disconnecting(port, rng, stats):
    mode = rng.randint(0, 2)
    s = connect(port, 30)
    try:
        if mode == 0:  # a stream read for a moment, then a hang-up
            s.sendall(post("/v1/completions", {"prompt": "Hi", "max_tokens": 64,
                                               "ignore_eos": True, "stream": True}))
            s.recv(256)
        elif mode == 1:  # half a request
            request = post("/v1/completions", {"prompt": "Hi", "max_tokens": 8})
            s.sendall(request[: len(request) // 2])
        else:  # a non-streaming request abandoned with a reset
            s.sendall(post("/v1/completions", {"prompt": "Hi", "max_tokens": 64,
                                               "ignore_eos": True}))
            time.sleep(0.05)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    finally:
        s.close()
    stats.add("disconnecting", True)


def health(port, stats):
    t0 = time.monotonic()
    with connect(port, 30) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, _, _ = read_response(s)
    with stats.lock:
        stats.health.append(time.monotonic() - t0)
    stats.add("health probe", status == 200, f"HTTP {status}")


def metric(port, name):
    with connect(port, 30) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, _, body = read_response(s)
    m = re.search(rb"^" + re.escape(name.encode()) + rb" (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvq")
    ap.add_argument("model")
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--kv-memory", default="512K")
    ap.add_argument("--rss-growth-mib", type=float, default=256)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not os.path.exists(os.path.join(args.model, "config.json")):
        print("skip: model missing")
        return 77
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    # stderr to a file: an unread pipe would fill and block the server.
    log = open(args.json + ".log" if args.json else os.devnull, "w")
    server = subprocess.Popen(
        [args.kvq, "serve", "-m", args.model, "--port", "0", "-t", "1",
         "--kv-memory", args.kv_memory, "--max-num-seqs", "8", "--max-waiting", "256",
         "--http-threads", "64"],
        stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    line = server.stdout.readline()
    m = re.search(r"listening on http://[^:]+:(\d+)", line)
    if not m:
        print("server did not start:", line)
        return 1
    port = int(m.group(1))
    stats = Stats()
    # Prompt token counts from one request each, before any load.
    prompt_tokens = {}
    for p in PROMPTS:
        with connect(port) as s:
            s.sendall(post("/v1/completions", {"prompt": p, "max_tokens": 1}))
            status, _, body = read_response(s)
            prompt_tokens[p] = json.loads(body)["usage"]["prompt_tokens"]
    rss = [rss_mib(server.pid)]
    start_rss = rss[0]
    deadline = time.monotonic() + args.seconds
    kinds = [(well_formed, 40), (well_formed_stream, 15), (malformed, 15), (slow, 8),
             (disconnecting, 15), (None, 7)]

    def worker(seed):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
            try:
                if kind is None:
                    health(port, stats)
                elif kind in (well_formed,):
                    kind(port, rng, stats, prompt_tokens)
                else:
                    kind(port, rng, stats)
            except (OSError, ValueError, KeyError, IndexError) as e:
                # For requests that must be answered, an exception (reset,
                # timeout, bad JSON) is a server failure; malformed and
                # disconnecting clients may see resets.
                labels = {well_formed: "well-formed completion",
                          well_formed_stream: "well-formed stream", None: "health probe"}
                if kind in labels:
                    stats.add(labels[kind], False, repr(e))
                else:
                    stats.add(kind.__name__ + " (client saw a reset)", True, repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        if server.poll() is not None:
            break
        rss.append(rss_mib(server.pid))
    for t in threads:
        t.join()
    crashed = server.poll() is not None
    blocks = None
    if not crashed:
        for _ in range(100):  # cancelled work drains within a step or two
            blocks = metric(port, "kvq_kv_blocks_used")
            if blocks == 0:
                break
            time.sleep(0.1)
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            code = "hung"
    else:
        code = server.returncode
    health_ms = sorted(x * 1e3 for x in stats.health) or [0]
    p99 = health_ms[min(len(health_ms) - 1, int(0.99 * len(health_ms)))]
    rows = [(k, v[0], v[1]) for k, v in sorted(stats.counts.items())]
    failed_must = sum(f for _, _, f in rows)
    result = {
        "seconds": args.seconds, "concurrency": args.concurrency, "kv_memory": args.kv_memory,
        "requests": sum(n for _, n, _ in rows), "rows": rows, "crashed": crashed,
        "exit_code_after_sigterm": code, "kv_blocks_used_at_end": blocks,
        "rss_start_mib": round(start_rss, 1), "rss_peak_mib": round(max(rss), 1),
        "rss_end_mib": round(rss[-1], 1), "health_p99_ms": round(p99, 1),
        "health_max_ms": round(health_ms[-1], 1), "errors": stats.errors,
    }
    print(f"\nkvq serve soak: {args.seconds:.0f} s, concurrency {args.concurrency}, "
          f"--kv-memory {args.kv_memory}\n")
    print("| client | requests | failed |\n|---|---:|---:|")
    for k, n, f in rows:
        print(f"| {k} | {n} | {f} |")
    print(f"\n| check | value |\n|---|---|")
    print(f"| server crashed | {'yes' if crashed else 'no'} |")
    print(f"| exit code after SIGTERM | {code} |")
    print(f"| KV blocks used at the end | {blocks} |")
    print(f"| RSS start / peak / end (MiB) | {start_rss:.0f} / {max(rss):.0f} / {rss[-1]:.0f} |")
    print(f"| /health p99 / max (ms) | {p99:.1f} / {health_ms[-1]:.1f} |")
    for e in stats.errors:
        print("error:", e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = (not crashed and code == 0 and blocks == 0 and failed_must == 0
          and max(rss) - start_rss < args.rss_growth_mib)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
