#!/usr/bin/env python3
"""Where `kvq serve`'s CPU time goes under the serving benchmark's load, from
`perf record` of the server during one cell of bench/serve_vs_llamacpp.sh
(bench/serve_profile.sh makes DIR): the samples of each SERVER.perf.txt
(`perf report --no-children --sort symbol -g none`) summed by what the symbol
does, beside the cell's output tokens/s (DIR/SERVER-cC.json).

The last column is an upper bound: the throughput the same run would have if
every attention sample cost nothing (1 / (1 - attention share)). A KV cache
type can only make attention cheaper, so no cache type can raise output
tokens/s beyond it.

  bench/serve_profile.py render DIR
  bench/serve_profile.py embed DOC ROOT NAME   DOC's <!-- profile:NAME --> block
  bench/serve_profile.py check DOC ROOT        every profile block equals its rendering
  bench/serve_profile.py --self-test ROOT
"""
import glob
import json
import os
import re
import sys

import doc_blocks

# (category, symbol regex), first match wins. The names are the kernels of
# src/ops (linear layers) and src/kv (attention); samples perf could not
# resolve to a symbol are libgomp's and the kernel's (thread waits).
CATEGORIES = [
    ("prefill GEMM", r"::(TileT|PanelColumns|PackTokens|PackPanel|DecodeSegment|MatmulPacked)"),
    ("decode matvec", r"::(MatvecRows|MatvecBatch|Q8Rows|QuantizeActivations|MatvecInt8)"),
    ("attention", r"kvq::codec::|CallExp|OnlineSoftmax|PagedKvCache::|kvq::N_\w+::Attend|expf"),
    ("other ops", r"kvq::"),
]
UNRESOLVED = "waits and unresolved"


def categorize(symbol):
    for name, pattern in CATEGORIES:
        if re.search(pattern, symbol):
            return name
    return UNRESOLVED


def read_profile(path):
    """{category: percent of samples} of one perf report text."""
    shares = {name: 0.0 for name, _ in CATEGORIES}
    shares[UNRESOLVED] = 0.0
    for line in open(path):
        m = re.match(r"\s*(\d+\.\d+)%\s+\[[.k]\]\s+(.*\S)", line)
        if m:
            shares[categorize(m.group(2))] += float(m.group(1))
    return shares


def render(run_dir):
    columns = [name for name, _ in CATEGORIES] + [UNRESOLVED]
    lines = []
    setup = os.path.join(run_dir, "setup.txt")
    if os.path.exists(setup):
        lines.append(open(setup).read().strip() + "\n")
    lines.append("| server | concurrency | most running | TPOT p50 ms | output tok/s | " +
                 " | ".join(columns) + " | output tok/s if attention were free | that / measured |")
    lines.append("| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in columns) +
                 " | ---: | ---: |")
    mix = None
    for profile in sorted(glob.glob(os.path.join(run_dir, "kvq-*.perf.txt"))):
        server = os.path.basename(profile)[:-len(".perf.txt")]
        cells = sorted(glob.glob(os.path.join(run_dir, f"{server}-c*.json")))
        if len(cells) != 1:
            sys.exit(f"serve_profile: {run_dir}: want one cell file for {server}, found {len(cells)}")
        cell = json.load(open(cells[0]))
        shares = read_profile(profile)
        total = sum(shares.values())
        attention = shares["attention"] / total
        mix = (cell["promptTokens"], cell["tokens"])
        lines.append(f"| {server} | {cell['concurrency']} | {cell['maxRunning']} | "
                     f"{cell['itlP50']:.0f} | {cell['tokensPerSecond']:.1f} | " +
                     " | ".join(f"{100 * shares[c] / total:.1f}%" for c in columns) +
                     f" | {cell['tokensPerSecond'] / (1 - attention):.1f} | {1 / (1 - attention):.2f}x |")
    if mix:
        lines.append(f"\nThe cells' requests: {mix[0]} prompt tokens and {mix[1]} output tokens "
                     f"({mix[0] / mix[1]:.2f} prompt tokens per output token).")
    return "\n".join(lines) + "\n"


def render_named(root):
    return lambda kind, name: render(os.path.join(root, name))


def hint(doc, root):
    return lambda kind, name: f"bench/serve_profile.py embed {doc} {root} {name}"


def main(argv):
    if argv[:1] == ["render"] and len(argv) == 2:
        sys.stdout.write(render(argv[1]))
    elif argv[:1] == ["embed"] and len(argv) == 4:
        doc_blocks.embed("serve_profile", argv[1], "profile", argv[3],
                         render(os.path.join(argv[2], argv[3])))
    elif argv[:1] == ["check"] and len(argv) == 3:
        return doc_blocks.check("serve_profile", argv[1], ["profile"], render_named(argv[2]),
                                hint(argv[1], argv[2]), require_one=True)
    elif argv[:1] == ["--self-test"] and len(argv) == 2:
        runs = sorted(d for d in os.listdir(argv[1])
                      if glob.glob(os.path.join(argv[1], d, "kvq-*.perf.txt")))
        if not runs:
            sys.exit(f"serve_profile: no profiles under {argv[1]}")
        return doc_blocks.self_test("serve_profile", "profile", runs[0], render_named(argv[1]),
                                    r"\| (\d+\.\d)% \|")
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
