#!/usr/bin/env python3
"""A table of codec_bench runs of several builds: one column per build, the
time of each benchmark in every round ("r1 / r2"), from the JSON files
BUILD-rN.json of one folder (codec_bench --benchmark_out_format=json).

  bench/codec_bench_table.py render DIR BUILD,BUILD,...     markdown
  bench/codec_bench_table.py embed DOC DIR BUILD,...        DOC's <!-- codec-bench:DIRNAME/BUILDS --> := render
  bench/codec_bench_table.py check DOC ROOT                 every codec-bench block equals render of
                                                            ROOT/DIRNAME and its BUILDS (a ctest)
  bench/codec_bench_table.py --self-test DIR BUILD,...      check fails on a changed figure

codec_bench's cold rows (`.../manual_time`) read 16384 rows from DRAM per
call, its Hot rows 1024 rows that stay in cache (bench/codec_bench.cc);
attention_bench's Decode16K rows are named as they are.
"""
import glob
import json
import os
import re
import sys

import doc_blocks


def times(path):
    data = json.load(open(path))
    unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}
    return {b["name"].replace("/manual_time", ""): b["real_time"] * unit[b["time_unit"]]
            for b in data["benchmarks"] if not b.get("error_occurred")}


def render(d, builds):
    runs = {}  # build -> [times of round 1, round 2, ...]
    for build in builds:
        files = sorted(glob.glob(os.path.join(d, f"{build}-r*.json")),
                       key=lambda p: int(re.search(r"-r(\d+)\.json$", p).group(1)))
        runs[build] = [times(p) for p in files]
    names = sorted({n for rs in runs.values() for r in rs for n in r})
    lines = ["µs per call, round 1 / round 2", "", "| benchmark | " + " | ".join(builds) + " |",
             "| --- |" + " ---: |" * len(builds)]
    for n in names:
        cells = [" / ".join(f"{r[n]:.1f}" if n in r else "n/a" for r in runs[b]) for b in builds]
        label = n if n.startswith(("Hot/", "Decode16K/")) else "Cold/" + n
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    return "\n".join(lines)


def main(argv):
    if len(argv) == 3 and argv[0] == "render":
        sys.stdout.write(render(argv[1], argv[2].split(",")))
        return 0
    if len(argv) == 4 and argv[0] == "embed":
        doc, d = argv[1], argv[2]
        name = os.path.basename(d.rstrip("/")) + "/" + argv[3]
        doc_blocks.embed("codec_bench_table", doc, "codec-bench", name, render(d, argv[3].split(",")))
        return 0
    if len(argv) == 3 and argv[0] == "check":
        doc, root = argv[1], argv[2]

        def block(kind, name):
            folder, builds = name.split("/")
            return render(os.path.join(root, folder), builds.split(","))

        return doc_blocks.check("codec_bench_table", doc, ["codec-bench"], block,
                                lambda kind, name: f"bench/codec_bench_table.py embed {doc} "
                                f"{root}/{name.split('/')[0]} {name.split('/')[1]}",
                                require_one=True)
    if len(argv) == 3 and argv[0] == "--self-test":
        name = os.path.basename(argv[1].rstrip("/")) + "/" + argv[2]
        return doc_blocks.self_test("codec_bench_table", "codec-bench", name,
                                    lambda kind, n: render(argv[1], argv[2].split(",")),
                                    r"\| (\d+\.\d) ")
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
