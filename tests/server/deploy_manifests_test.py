#!/usr/bin/env python3
"""deploy/ against the kvq serve it deploys (no container runtime or cluster
is needed): the Dockerfile and the Kubernetes manifests are parsed, every
flag they pass must be one `kvq serve --help` lists, their ports, probe and
scrape paths, user, volume and grace period must agree with each other and
with kvq's drain, and kvq serve is run with the very arguments of the
Dockerfile's CMD and of the Deployment (only the model, host and port
swapped for the test model on a free loopback port) to see it start, answer
the probe and scrape paths with 200, and exit 0 on SIGTERM.

    deploy_manifests_test.py KVQ MODEL_DIR SOURCE_DIR

Exit 77 (ctest's skip) when PyYAML is missing (Debian: python3-yaml).
"""
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

try:
    import yaml
except ImportError:
    print("SKIP: PyYAML is missing (Debian's python3-yaml, installed by scripts/setup.sh)")
    sys.exit(77)

FAILURES = []


def check(ok, message):
    if not ok:
        FAILURES.append(message)
        print(f"FAIL: {message}")
    return ok


def serve_help(kvq):
    """The options `kvq serve --help` lists, and its default port."""
    text = subprocess.run([kvq, "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout
    options = set()
    for line in text.splitlines():
        if line.startswith("  -"):
            head = line.split()[0]  # "-m,--model" or "--port"
            options.update(o for o in head.split(",") if o.startswith("-"))
    port = re.search(r"--port .*?\(default (\d+)\)", text, re.S)
    return options, int(port.group(1)) if port else None


def flag_values(args, options, where):
    """{flag: value} of an argument list; every flag must be kvq's."""
    values = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if check(flag in options, f"{where}: {flag} is not a kvq serve option"):
            # Every option the deploy files pass takes a value.
            values[flag] = args[i + 1] if i + 1 < len(args) else None
        i += 2
    return values


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError as e:
        return None, str(e)


def run_with(kvq, model, args, paths, where):
    """kvq serve with `args`, the model, host and port swapped; checks that
    each path answers 200 and that SIGTERM ends it with 0."""
    swap = {"-m": model, "--model": model, "--host": "127.0.0.1", "--port": "0"}
    run = [kvq, "serve"]
    for i in range(0, len(args), 2):
        run += [args[i], swap.get(args[i], args[i + 1])]
    proc = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        deadline = time.monotonic() + 120  # model load on a loaded machine
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            port = int(m.group(1)) if m else None
        if not check(port is not None, f"{where}: kvq serve {' '.join(args)} did not start: "
                     f"{proc.stderr.read() if proc.poll() is not None else 'no listening line'}"):
            return
        for path in paths:
            status, body = get(f"http://127.0.0.1:{port}{path}")
            check(status == 200, f"{where}: GET {path} answered {status}")
            if path == "/metrics":
                check("# TYPE kvq_" in body, f"{where}: /metrics has no kvq_ samples")
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        check(code == 0, f"{where}: exit {code} after SIGTERM: {proc.stderr.read()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def dockerfile_stages(path):
    """[[(INSTRUCTION, rest)]] per FROM stage; continuation lines joined."""
    stages, logical = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        word, _, rest = logical.partition(" ")
        logical = ""
        if word.upper() == "FROM":
            stages.append([])
        check(bool(stages), f"{path}: {word} before FROM")
        if stages:
            stages[-1].append((word.upper(), rest.strip()))
    return stages


def one(stage, word):
    found = [rest for w, rest in stage if w == word]
    return found[-1] if found else None


def check_dockerfile(path, options, answer_seconds):
    """Returns what the manifests must agree with: port, uid, volume, args."""
    stages = dockerfile_stages(path)
    if not check(len(stages) >= 2, f"{path}: a build stage and a run stage expected"):
        return None
    for stage in stages:
        base = stage[0][1]
        check(re.fullmatch(r"debian:12(-slim)?( AS \w+)?", base, re.I) is not None,
              f"{path}: FROM {base}: Debian 12 expected")
    build, runtime = stages[0], stages[-1]
    check(any(w == "RUN" and "scripts/setup.sh" in rest for w, rest in build),
          f"{path}: the build stage must run scripts/setup.sh")
    for w, rest in runtime:
        if w in ("COPY", "ADD"):
            check(rest.startswith("--from=") and rest.split()[1].endswith("/bin/kvq"),
                  f"{path}: the run stage copies only the kvq binary, not: {w} {rest}")
            check(not re.search(r"\.(gguf|safetensors)\b|models", rest),
                  f"{path}: no model may be baked in: {w} {rest}")
    user = one(runtime, "USER") or "root"
    uid = user.split(":")[0]
    check(uid.isdigit() and uid != "0", f"{path}: USER {user}: a numeric non-root uid expected")
    check(one(runtime, "STOPSIGNAL") == "SIGTERM", f"{path}: STOPSIGNAL SIGTERM expected")
    volume = one(runtime, "VOLUME")
    check(volume is not None, f"{path}: the model volume (VOLUME) is missing")
    entry = json.loads(one(runtime, "ENTRYPOINT") or "[]")
    check(len(entry) == 2 and entry[0].endswith("/kvq") and entry[1] == "serve",
          f"{path}: ENTRYPOINT [.../kvq, serve] expected, got {entry}")
    cmd = json.loads(one(runtime, "CMD") or "[]")
    values = flag_values(cmd, options, f"{path} CMD")
    port = values.get("--port")
    check(port is not None and one(runtime, "EXPOSE") == port,
          f"{path}: EXPOSE {one(runtime, 'EXPOSE')} and --port {port} differ")
    check(values.get("--host") == "0.0.0.0", f"{path}: --host 0.0.0.0 (reachable from outside) expected")
    model = values.get("-m", values.get("--model", ""))
    check(volume is not None and model.startswith(volume.rstrip("/") + "/"),
          f"{path}: -m {model} is not under VOLUME {volume}")
    health = one(runtime, "HEALTHCHECK") or ""
    check(f"http://127.0.0.1:{port}/health" in health,
          f"{path}: HEALTHCHECK must ask http://127.0.0.1:{port}/health: {health}")
    return {"port": port, "uid": int(uid) if uid.isdigit() else None, "volume": volume, "cmd": cmd}


def resolve_port(port, container):
    """A probe's or Service's port (a number or a container port's name)."""
    for p in container.get("ports", []):
        if port in (p.get("name"), p.get("containerPort")):
            return p.get("containerPort")
    return None


def check_deployment(doc, docker, options, answer_seconds, where):
    pod = doc["spec"]["template"]
    spec = pod["spec"]
    check(doc["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
          f"{where}: the selector does not match the pod labels")
    (container,) = spec["containers"]
    args = container.get("args", [])
    values = flag_values(args, options, f"{where} args")
    port = int(values.get("--port", 0))
    check(resolve_port("http", container) == port, f"{where}: containerPort http != --port {port}")
    check(str(port) == docker["port"], f"{where}: --port {port} != the Dockerfile's --port {docker['port']}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe not in container:
            check(probe == "startupProbe", f"{where}: {probe} missing")
            continue
        http = container[probe].get("httpGet", {})
        check(http.get("path") == "/health", f"{where}: {probe} asks {http.get('path')}, not /health")
        check(resolve_port(http.get("port"), container) == port, f"{where}: {probe} port != {port}")
    notes = pod["metadata"].get("annotations", {})
    check(notes.get("prometheus.io/scrape") == "true" and notes.get("prometheus.io/port") == str(port)
          and notes.get("prometheus.io/path") == "/metrics",
          f"{where}: prometheus.io annotations must scrape :{port}/metrics: {notes}")
    # The drain: preStop, then up to --shutdown-timeout for the engine and
    # kvq's own answer time for the last bytes; the grace period must cover it.
    drain = float(values.get("--shutdown-timeout", 30)) + answer_seconds
    pre = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_seconds = float(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    grace = spec.get("terminationGracePeriodSeconds", 30)
    check(grace > pre_seconds + drain, f"{where}: terminationGracePeriodSeconds {grace} <= preStop "
          f"{pre_seconds} + --shutdown-timeout + {answer_seconds} s = {pre_seconds + drain}")
    live = container.get("livenessProbe", {})
    live_window = live.get("periodSeconds", 10) * live.get("failureThreshold", 3)
    check(live_window > drain, f"{where}: liveness gives up after {live_window} s, within the "
          f"{drain} s drain (/health is 503 then): a draining pod would be restarted")
    res = container.get("resources", {})
    for kind in ("requests", "limits"):
        check({"cpu", "memory"} <= set(res.get(kind, {})), f"{where}: resources.{kind} cpu+memory")
    cpu = str(res.get("limits", {}).get("cpu", ""))
    check(values.get("-t", values.get("--threads")) == cpu,
          f"{where}: -t must equal the CPU limit {cpu} (kvq counts the node's cores)")
    security = spec.get("securityContext", {})
    check(security.get("runAsNonRoot") is True and security.get("runAsUser") == docker["uid"],
          f"{where}: runAsNonRoot with the image's uid {docker['uid']} expected")
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    model = values.get("-m", values.get("--model", ""))
    mount = next((m for m in mounts.values() if model.startswith(m["mountPath"].rstrip("/") + "/")), None)
    check(mount is not None and mount["mountPath"] == docker["volume"] and mount.get("readOnly"),
          f"{where}: -m {model} must be on a read-only mount at the image's VOLUME {docker['volume']}")
    return container, args, pod["metadata"]["labels"]


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    kvq, model, source = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    options, default_port = serve_help(kvq)
    serve_source = (source / "src/tools/cmd_serve.cc").read_text()
    answer = re.search(r"kAnswerTime = std::chrono::seconds\((\d+)\)", serve_source)
    check(answer is not None, "cmd_serve.cc: kAnswerTime not found")
    answer_seconds = int(answer.group(1)) if answer else 0

    docker = check_dockerfile(source / "deploy/Dockerfile", options, answer_seconds)
    if docker is None:
        return 1
    docs = []
    for path in sorted((source / "deploy/k8s").glob("*.yaml")):
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    kinds = {}
    for name, d in docs:
        kinds.setdefault(d["kind"], []).append((name, d))
    if not all([check(kind in kinds, f"deploy/k8s: no {kind}") for kind in ("Deployment", "Service")]):
        return 1
    name, deployment = kinds["Deployment"][0]
    container, args, labels = check_deployment(deployment, docker, options, answer_seconds,
                                               f"{name} Deployment")
    claims = {d["metadata"]["name"] for _, d in kinds.get("PersistentVolumeClaim", [])}
    for v in deployment["spec"]["template"]["spec"].get("volumes", []):
        claim = v.get("persistentVolumeClaim", {}).get("claimName")
        check(claim is None or claim in claims, f"{name}: volume claim {claim} is not defined")
    service_ports = set()
    service_labels = {}
    for sname, svc in kinds["Service"]:
        check(svc["spec"]["selector"].items() <= labels.items(),
              f"{sname} Service: its selector matches no pod of the Deployment")
        for p in svc["spec"]["ports"]:
            check(resolve_port(p.get("targetPort", p["port"]), container) is not None,
                  f"{sname} Service: targetPort {p.get('targetPort')} is no container port")
            service_ports.add(p.get("name"))
        service_labels.update(svc["metadata"].get("labels", {}))
    for mname, monitor in kinds.get("ServiceMonitor", []):
        check(monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items(),
              f"{mname}: its selector matches no Service")
        for e in monitor["spec"]["endpoints"]:
            check(e.get("port") in service_ports and e.get("path") == "/metrics",
                  f"{mname}: endpoint {e} must be a Service port name with path /metrics")

    # The same arguments on the real server.
    paths = sorted({"/metrics"} | {container[p]["httpGet"]["path"] for p in
                                   ("readinessProbe", "livenessProbe", "startupProbe") if p in container})
    run_with(kvq, model, docker["cmd"], ["/health", "/metrics"], "Dockerfile CMD")
    run_with(kvq, model, args, paths, f"{name} Deployment args")
    print(f"{'FAIL' if FAILURES else 'PASS'}: Dockerfile, {len(docs)} Kubernetes objects, kvq serve "
          f"--help ({len(options)} options, default port {default_port})")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
