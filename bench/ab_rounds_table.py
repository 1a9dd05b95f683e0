#!/usr/bin/env python3
"""Two builds alternated round by round: per-round ratios and their median.

A run directory DIR holds ab-labels.txt ("BEFORE AFTER") and, per build and
round R, <label>-R.json (ops_bench --benchmark_format=json; its read probe
line before the JSON is skipped; a row's times in ms, or in µs when all of
them are under a millisecond) and/or <label>-R.bench.md (`kvq bench` table
rows). Every benchmark gets a row: each round's figure for both builds and
AFTER's speed over BEFORE's per round (time ratio for ops_bench and seconds,
t/s ratio for kvq bench), with the median. Rounds ran one after the other on
a shared machine, so only same-round ratios are compared.

A second kind, vs-llamacpp, lists the llama.cpp ratio rows of every
DIR/*vs-llamacpp*.log (bench/vs_llamacpp.sh's output); a third,
same-answers, counts the same answers of the pairs of runs DIR/pairs.txt
names (render_same_answers).

  bench/ab_rounds_table.py render DIR [ab-rounds|vs-llamacpp|same-answers]
  bench/ab_rounds_table.py embed DOC ROOT NAME   (DIR = ROOT/NAME, into its
                                                  <!-- KIND:NAME --> blocks)
  bench/ab_rounds_table.py check DOC ROOT        (a ctest: every block is current)
  bench/ab_rounds_table.py --self-test ROOT
"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_blocks  # noqa: E402


def read_round(directory, label, rnd):
    """{benchmark: (figure, unit, higher_is_better)} of one build's round."""
    out = {}
    path = os.path.join(directory, f"{label}-{rnd}.json")
    if os.path.exists(path):
        text = open(path).read()
        for b in json.loads(text[text.index("{"):])["benchmarks"]:
            if b.get("run_type") != "aggregate":
                name = b["name"].replace("/manual_time", "")
                out[name] = (b["real_time"] / 1e6, "ms", False)  # ns -> ms
    path = os.path.join(directory, f"{label}-{rnd}.bench.md")
    if os.path.exists(path):
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 8 and re.match(r"(pp|tg)\d+", cells[6]):
                model = os.path.basename(cells[0].split()[-1])
                out[f"kvq bench {cells[6]} {model} {cells[5]} cache, {cells[4]} threads"] = (
                    float(cells[7].split("±")[0]), "t/s", True)
    path = os.path.join(directory, f"{label}-{rnd}.seconds")
    if os.path.exists(path):  # "WHAT<TAB>SECONDS" lines: wall time of a whole command
        for line in open(path):
            what, seconds = line.rstrip("\n").split("\t")
            out[what] = (float(seconds), "s", False)
    return out


def render(directory):
    before, after = open(os.path.join(directory, "ab-labels.txt")).read().split()
    rounds = sorted({int(m.group(1)) for p in os.listdir(directory)
                     for m in [re.match(re.escape(before) + r"-(\d+)\.", p)] if m})
    if not rounds:
        sys.exit(f"ab_rounds_table: {directory}: no {before}-R results")
    runs = [(read_round(directory, before, r), read_round(directory, after, r)) for r in rounds]
    lines = [f"| benchmark | unit | {before} (rounds) | {after} (rounds) | "
             f"{after} speed / {before} per round | median |",
             "| --- | --- | --- | --- | --- | ---: |"]
    for name in sorted(set.intersection(*(set(a) & set(b) for a, b in runs))):
        a = [run[0][name][0] for run in runs]
        b = [run[1][name][0] for run in runs]
        unit, higher = runs[0][0][name][1:]
        if unit == "ms" and max(a + b) < 1:  # kernels under a millisecond keep their digits
            a, b, unit = [v * 1e3 for v in a], [v * 1e3 for v in b], "µs"
        ratios = [(y / x) if higher else (x / y) for x, y in zip(a, b)]
        lines.append(f"| {name} | {unit} | {' '.join(f'{v:.1f}' for v in a)} | "
                     f"{' '.join(f'{v:.1f}' for v in b)} | "
                     f"{' '.join(f'{v:.2f}' for v in ratios)} | "
                     f"{statistics.median(ratios):.2f} |")
    return "\n".join(lines) + "\n"


def render_peer(directory):
    """The ratio rows bench/vs_llamacpp.sh printed, per log, in run order."""
    lines = ["| log | test | llama.cpp t/s | kvq t/s | kvq / llama.cpp |",
             "| --- | --- | ---: | ---: | ---: |"]
    for path in sorted(glob.glob(os.path.join(directory, "*vs-llamacpp*.log"))):
        for line in open(path):
            if re.match(r"\| (pp|tg)\d+ \| [\d.]+ ± [\d.]+ \| [\d.]+ ± [\d.]+ \| [\d.]+ \|$",
                        line.strip()):
                lines.append(f"| {os.path.basename(path)} {line.strip()}")
    if len(lines) == 2:
        sys.exit(f"ab_rounds_table: {directory}: no vs_llamacpp ratio rows")
    return "\n".join(lines) + "\n"


def render_same_answers(directory):
    """Per line "A B" of DIR/pairs.txt: on how many problems the answer files
    DIR/A.answers.jsonl and DIR/B.answers.jsonl (one {"index", "answer"} per
    line, by problem) hold the same text."""
    def answers(label):
        return {r["index"]: r["answer"] for r in map(json.loads, open(
            os.path.join(directory, f"{label}.answers.jsonl")))}

    lines = ["| answers A | answers B | same text |", "| --- | --- | ---: |"]
    for pair in open(os.path.join(directory, "pairs.txt")):
        label_a, label_b = pair.split()
        a, b = answers(label_a), answers(label_b)
        if a.keys() != b.keys():
            sys.exit(f"ab_rounds_table: {directory}: {label_a} {label_b} answer different problems")
        same = sum(a[i] == b[i] for i in a)
        lines.append(f"| {label_a} | {label_b} | {same}/{len(a)} |")
    return "\n".join(lines) + "\n"


KINDS = {"ab-rounds": render, "vs-llamacpp": render_peer, "same-answers": render_same_answers}


def applies(kind, directory):
    if kind == "same-answers":
        return os.path.exists(os.path.join(directory, "pairs.txt"))
    return kind == "ab-rounds" or bool(glob.glob(os.path.join(directory, "*vs-llamacpp*.log")))


def main(argv):
    return doc_blocks.cli(
        "ab_rounds_table", argv, KINDS, applies,
        lambda root: doc_blocks.run_dirs(root, "ab-labels.txt", "*-1.bench.md"),
        r"\| (\d+\.\d\d) \|\n", __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
