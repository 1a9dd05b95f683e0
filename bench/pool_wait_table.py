#!/usr/bin/env python3
"""bench/pool_wait.sh's log as a table: decode and prefill t/s per thread
waiting setting, idle and with one core busy, each round and the median,
and the median over OpenMP's default waits under the same load.

A run directory DIR holds log.txt (bench/pool_wait.sh's output). In each
(load, round) a setting's first line is decode, its second prefill; a line
with nothing after its label was cut off after 300 s. A second kind,
pool-wait-study, copies DIR/study.txt (bench/study_under_load.sh's output
and notes) whole into a code block.

  bench/pool_wait_table.py render DIR
  bench/pool_wait_table.py embed DOC ROOT NAME   (DIR = ROOT/NAME, into its
                                                  <!-- pool-wait:NAME --> block)
  bench/pool_wait_table.py check DOC ROOT        (a ctest: every block is current)
  bench/pool_wait_table.py --self-test ROOT
"""
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_blocks  # noqa: E402

LINE = re.compile(r"^(idle|busy) round (\d+) (openmp default|openmp SPINCOUNT=1000|"
                  r"pool --poll-us \d+):(.*)$")
BASELINE = "openmp default"


def read(directory):
    """{(load, run, setting): {round: t/s or None}}, in the log's order."""
    table, seen = {}, set()
    for line in open(os.path.join(directory, "log.txt")):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        load, rnd, setting, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        first = (load, rnd, setting) not in seen
        seen.add((load, rnd, setting))
        run = "decode tg48" if first else "prefill pp512"
        value = re.search(r"\(([\d.]+) tokens/s\)" if first else r"pp512\s+([\d.]+)", rest)
        table.setdefault((load, run, setting), {})[rnd] = float(value.group(1)) if value else None
    return table


def median(rounds):
    values = [v for v in rounds.values() if v is not None]
    return statistics.median(values) if values else None


def render(directory):
    table = read(directory)
    rounds = sorted({r for cells in table.values() for r in cells})
    head = ("| load | run | threads wait | " + " | ".join(f"round {r}" for r in rounds) +
            " | median t/s | vs OpenMP default |\n")
    out = [head, "|" + "---|" * (len(rounds) + 5) + "\n"]
    for (load, run, setting), cells in table.items():
        fig = [f"{cells[r]:.1f}" if cells.get(r) is not None else "cut off" for r in rounds]
        mid = median(cells)
        base = median(table.get((load, run, BASELINE), {}))
        ratio = f"{mid / base:.2f}" if mid is not None and base else "-"
        mid_text = f"{mid:.1f}" if mid is not None else "-"
        out.append(f"| {load} | {run} | {setting} | " + " | ".join(fig) +
                   f" | {mid_text} | {ratio} |\n")
    return "".join(out)


def render_study(directory):
    return "```\n" + open(os.path.join(directory, "study.txt")).read() + "```\n"


def applies(kind, directory):
    name = "log.txt" if kind == "pool-wait" else "study.txt"
    return os.path.exists(os.path.join(directory, name))


def main(argv):
    return doc_blocks.cli(
        "pool_wait_table", argv, {"pool-wait": render, "pool-wait-study": render_study}, applies,
        lambda root: [d for d in doc_blocks.run_dirs(root, "log.txt") if d.startswith("pool-wait")],
        r"\| (\d+\.\d) \| [\d.]+ \|\n", __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
