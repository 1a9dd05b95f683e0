#!/usr/bin/env python3
"""Batched integer-dot decode, before and after (ops_bench MatvecInt8Batch).

A run directory DIR holds <label>-<run>.json (ops_bench's output with
--benchmark_format=json and --benchmark_repetitions) for two builds, and
labels.txt naming them: "BEFORE AFTER". The table gives, per weight type and
token count, each build's best Gmacs_cpu over every repetition and run (the
least disturbed one on a shared machine) and their ratio.

A directory without labels.txt is a crossover run instead (packed-crossover):
MatvecInt8Batch against MatmulPackedBatch, best of every DIR/run-*.json.

  bench/matvec_batch_table.py render DIR [matvec-batch|packed-crossover]
  bench/matvec_batch_table.py embed DOC ROOT NAME   (DIR = ROOT/NAME, into its
                                                     <!-- KIND:NAME --> block)
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


def render_crossover(directory):
    """Per weight type and row count: the integer tile's and the packed GEMM's
    best Gmac/s over every repetition of every run, and the tile's lead."""
    best = {}
    for path in sorted(glob.glob(os.path.join(directory, "run-*.json"))):
        text = open(path).read()
        for b in json.loads(text[text.index("{"):])["benchmarks"]:
            m = re.match(r"(MatvecInt8Batch|MatmulPackedBatch)/(\w+)/(\d+x\d+)/n:(\d+)", b["name"])
            if m and b.get("run_type") != "aggregate":
                gmacs = b["Gmacs_cpu"] if m.group(1) == "MatvecInt8Batch" else b["GFLOPs_cpu"] / 2
                key = (m.group(2), m.group(3), int(m.group(4)), m.group(1))
                best[key] = max(best.get(key, 0.0), gmacs)
    lines = ["| weights | shape | rows | integer tile Gmac/s | packed GEMM Gmac/s | tile / GEMM |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for t, shape, n, impl in sorted(best):
        if impl == "MatvecInt8Batch" and (t, shape, n, "MatmulPackedBatch") in best:
            a, b = best[(t, shape, n, impl)], best[(t, shape, n, "MatmulPackedBatch")]
            lines.append(f"| {t} | {shape} | {n} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    if len(lines) == 2:
        sys.exit(f"matvec_batch_table: {directory}: no crossover pairs")
    return "\n".join(lines) + "\n"


KINDS = {"matvec-batch": render, "packed-crossover": render_crossover}


def applies(kind, directory):
    has_labels = os.path.exists(os.path.join(directory, "labels.txt"))
    return has_labels if kind == "matvec-batch" else not has_labels


def main(argv):
    return doc_blocks.cli("matvec_batch_table", argv, KINDS, applies,
                          lambda root: doc_blocks.run_dirs(root, "labels.txt"),
                          r"\| (\d+\.\d) \|", __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
