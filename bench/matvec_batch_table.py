#!/usr/bin/env python3
"""Batched integer-dot decode, before and after (ops_bench MatvecInt8Batch).

A run directory DIR holds <label>-<run>.json (ops_bench's output with
--benchmark_format=json and --benchmark_repetitions) for two builds, and
labels.txt naming them: "BEFORE AFTER". The table gives, per weight type and
token count, each build's best Gmacs_cpu over every repetition and run (the
least disturbed one on a shared machine) and their ratio.

  bench/matvec_batch_table.py render DIR
  bench/matvec_batch_table.py embed DOC ROOT NAME   (DIR = ROOT/NAME, into the
                                                     <!-- matvec-batch:NAME --> block)
  bench/matvec_batch_table.py check DOC ROOT        (a ctest: every block is current)
  bench/matvec_batch_table.py --self-test ROOT
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_blocks  # noqa: E402


def best(directory, label):
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, f"{label}-*.json"))):
        with open(path) as f:
            text = f.read()  # ops_bench prints its read probe before the JSON
        for b in json.loads(text[text.index("{"):])["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            m = re.match(r"MatvecInt8Batch/(\w+)/(\d+x\d+)/n:(\d+)", b["name"])
            if m:
                key = (m.group(1), m.group(2), int(m.group(3)))
                out[key] = max(out.get(key, 0.0), b["Gmacs_cpu"])
    return out


def render(directory):
    before, after = open(os.path.join(directory, "labels.txt")).read().split()
    a, b = best(directory, before), best(directory, after)
    if not a or not b:
        sys.exit(f"matvec_batch_table: {directory}: no {before}-*.json or {after}-*.json results")
    lines = [f"| weights | shape | tokens | {before} Gmac/s | {after} Gmac/s | {after} / {before} |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for key in sorted(set(a) & set(b)):
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a[key]:.1f} | {b[key]:.1f} | "
                     f"{b[key] / a[key]:.2f} |")
    return "\n".join(lines) + "\n"


def render_named(root):
    return lambda kind, name: render(os.path.join(root, name))


def main(argv):
    if argv[:1] == ["render"] and len(argv) == 2:
        sys.stdout.write(render(argv[1]))
    elif argv[:1] == ["embed"] and len(argv) == 4:
        doc_blocks.embed("matvec_batch_table", argv[1], "matvec-batch", argv[3],
                         render(os.path.join(argv[2], argv[3])))
    elif argv[:1] == ["check"] and len(argv) == 3:
        return doc_blocks.check(
            "matvec_batch_table", argv[1], ["matvec-batch"], render_named(argv[2]),
            lambda kind, name: f"bench/matvec_batch_table.py embed {argv[1]} {argv[2]} {name}",
            require_one=True)
    elif argv[:1] == ["--self-test"] and len(argv) == 2:
        runs = doc_blocks.run_dirs(argv[1], "labels.txt")
        if not runs:
            sys.exit(f"matvec_batch_table: no run directories under {argv[1]}")
        return doc_blocks.self_test("matvec_batch_table", "matvec-batch", runs[0],
                                    render_named(argv[1]), r"\| (\d+\.\d) \|")
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
