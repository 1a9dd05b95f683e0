#!/usr/bin/env python3
"""The table of bench/vs_llamacpp_depth.sh from its output folder (rerunnable on
partial results: pairs whose files are missing are skipped).

  bench/depth_table.py OUT_DIR PROBE_GB_S MODEL PAIRS   the script's own call
  bench/depth_table.py render DIR         DIR/run.json names the model and pairs;
                                          the floor uses the fastest probe in DIR/probe.txt
  bench/depth_table.py embed DOC ROOT NAME
                                          DOC's <!-- depth:NAME begin/end --> block := render ROOT/NAME
  bench/depth_table.py embed DOC ROOT serve:NAME
                                          DOC's <!-- serve:NAME begin/end --> block := the table of
                                          bench/serve_vs_llamacpp_table.mjs ROOT/NAME (node)
  bench/depth_table.py embed DOC ROOT prefix:NAME
                                          the same for serve_bench.sh's summary of ROOT/NAME/results.jsonl
                                          (serve-bench:NAME likewise: the kind says what the run compares)
  bench/depth_table.py check DOC ROOT     every depth and serve block of DOC equals its rendering
  bench/depth_table.py --self-test ROOT   check fails on a stale block

A run that ships (docs/bench/...) keeps its raw files, so the tables quoted in
docs/benchmarks.md are generated from them and tests/CMakeLists.txt's
benchmarks_doc_test keeps them equal.
"""
import json
import os
import re
import subprocess
import sys

import doc_blocks


def table(out, probe, model, pairs):
    lines = [f"model: {model}, read probe {probe:.1f} GB/s", "",
             "| kvq KV | llama.cpp KV | test | llama.cpp t/s | kvq t/s | kvq / llama.cpp "
             "| kvq floor t/s | kvq / floor |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for ours, theirs in pairs:
        files = [f"{out}/llama_{theirs}.json", f"{out}/kvq_{ours}.md", f"{out}/plan_{ours}.json"]
        if not all(os.path.exists(f) and os.path.getsize(f) > 0 for f in files):
            lines.append(f"| {ours} | {theirs} | (not measured: missing or empty result files) "
                         "| | | | | |")
            continue
        llama = {}
        for row in json.load(open(f"{out}/llama_{theirs}.json")):
            test = ("pp%d" % row["n_prompt"]) if row["n_gen"] == 0 else ("tg%d" % row["n_gen"])
            llama[(test, row.get("n_depth", 0))] = row["avg_ts"]
        kvq = {}
        for line in open(f"{out}/kvq_{ours}.md"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            m = re.match(r"((?:pp|tg)\d+)(?: @ d(\d+))?$", cells[6]) if len(cells) == 8 else None
            if m:
                kvq[(m.group(1), int(m.group(2) or 0))] = float(cells[7].split("±")[0])
        plan = json.load(open(f"{out}/plan_{ours}.json"))["plan"]
        bpt = plan["kv_bytes"] / plan["context"]  # exact bytes per cached token, all layers
        weights = plan["weight_bytes"]            # every weight byte is read once per decoded token
        for key in sorted(llama):
            if key not in kvq:
                continue
            test, depth = key
            if test.startswith("tg") and bpt:
                t = probe * 1e9 / (weights + bpt * (depth + 1))
                floor = f"{t:.1f} | {kvq[key] / t:.2f}"
            else:
                floor = "- | -"
            lines.append(f"| {ours} | {theirs} | {test} @ d{depth} | {llama[key]:.2f} | "
                         f"{kvq[key]:.2f} | {kvq[key] / llama[key]:.2f} | {floor} |")
    return "\n".join(lines) + "\n"


def render(run_dir):
    run = json.load(open(os.path.join(run_dir, "run.json")))
    probes = [float(x) for x in open(os.path.join(run_dir, "probe.txt")).read().split()]
    pairs = [tuple(p.split(":")) for p in run["pairs"].split(",")]
    return table(run_dir, max(probes), run["model"], pairs)


def render_serve(run_dir):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_vs_llamacpp_table.mjs")
    return subprocess.run(["node", script, run_dir], check=True, capture_output=True,
                          text=True).stdout


def render_prefix(run_dir):
    """serve_bench.sh's summary of DIR/results.jsonl against its first row's label."""
    results = os.path.join(run_dir, "results.jsonl")
    baseline = json.loads(open(results).readline())["label"]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_load.mjs")
    return subprocess.run(["node", script, "--summarize", results, "--baseline", baseline],
                          check=True, capture_output=True, text=True).stdout


def render_block(kind, path):
    renderers = {"serve": render_serve, "prefix": render_prefix, "serve-bench": render_prefix}
    return renderers.get(kind, render)(path)


KINDS = ("depth", "serve", "prefix", "serve-bench")


def render_named(root):
    return lambda kind, name: render_block(kind, os.path.join(root, name))


def hint(doc, root):
    return lambda kind, name: (f"bench/depth_table.py embed {doc} {root} "
                               f"{name if kind == 'depth' else kind + ':' + name}")


def embed(doc, root, name):
    kind, name = name.split(":", 1) if ":" in name else ("depth", name)
    doc_blocks.embed("depth_table", doc, kind, name, render_block(kind, os.path.join(root, name)))


def check(doc, root):
    return doc_blocks.check("depth_table", doc, KINDS, render_named(root), hint(doc, root))


def self_test(root):
    """check must pass on the shipped doc and fail once a figure is changed."""
    runs = [d for d in sorted(os.listdir(root)) if os.path.exists(os.path.join(root, d, "run.json"))]
    if not runs:
        sys.exit(f"depth_table: no runs under {root}")
    return doc_blocks.self_test("depth_table", "depth", runs[0], render_named(root),
                                r"\| (\d+\.\d\d) \|")


def main(argv):
    if argv[:1] == ["render"]:
        sys.stdout.write(render(argv[1]))
    elif argv[:1] == ["embed"]:
        embed(argv[1], argv[2], argv[3])
    elif argv[:1] == ["check"]:
        return check(argv[1], argv[2])
    elif argv[:1] == ["--self-test"]:
        return self_test(argv[1])
    else:
        out, probe, model = argv[0], float(argv[1]), argv[2]
        print()
        sys.stdout.write(table(out, probe, model, [tuple(p.split(":")) for p in argv[3].split(",")]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
