#!/usr/bin/env python3
"""Issue 19's decode-attention table at 16K tokens from attention_bench's JSON
files (one per SHAPE.CODEC: that codec's Decode16K rows beside f16 and int4 in
the same run, the read probe interleaved in every iteration).

  bench/decode16k_table.py render DIR     markdown of DIR/*.json
  bench/decode16k_table.py embed DOC DIR  DOC's <!-- decode16k begin/end --> := render DIR
  bench/decode16k_table.py check DOC DIR  the block equals render DIR, and every
      <!-- decode16k-compare:BEFORE,AFTER --> block equals compare of those two
      folders beside DIR (decode16k_doc_test)
  bench/decode16k_table.py compare BEFORE_DIR AFTER_DIR   markdown: two sweeps side by side
  bench/decode16k_table.py embed-compare DOC BEFORE_DIR AFTER_DIR  DOC's block := compare
  bench/decode16k_table.py --self-test DIR  check fails on a changed figure

"vs f16" is f16's time / the codec's time in the same run (above 1: faster).
"""
import glob
import json
import os
import re
import sys

import doc_blocks


def rows_of(path):
    data = json.load(open(path))
    out = {}
    for b in data["benchmarks"]:
        m = re.match(r"Decode16K/([^/]+)/(.+)/ctx:16384/threads:(\d)/", b["name"])
        if not m or b.get("error_occurred"):
            continue
        unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]]
        out[(m.group(2), int(m.group(3)))] = dict(us=b["real_time"] * unit, gbps=b["GBps"],
                                                  probe=b["probe_GBps"], vs=b["vs_probe"],
                                                  mb=b["cache_MB"])
    shape = re.match(r"Decode16K/([^/]+)/", data["benchmarks"][0]["name"]) if out else None
    return (shape.group(1) if shape else None), out


def runs(d):
    """(shape, codec, rows) of every run SHAPE.CODEC.json of a sweep folder."""
    for path in sorted(glob.glob(os.path.join(d, "*.json"))):
        shape, rows = rows_of(path)
        if shape:
            yield shape, os.path.basename(path)[len(shape) + 1:-len(".json")], rows


def render(d):
    lines = []
    shapes = {}
    for shape, codec, rows in runs(d):
        if all((c, t) in rows for c in ("f16", codec) for t in (1, 2)):
            shapes.setdefault(shape, []).append((codec, rows))
    for shape in sorted(shapes):
        lines += [f"**{shape}** layer shape, 16384 tokens, 16-token blocks", "",
                  "| codec | threads | µs/layer | f16 µs (same run) | vs f16 | int4 µs | cache MB | GB/s | probe GB/s | vs probe |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for codec, rows in sorted(shapes[shape], key=lambda x: x[0]):
            for t in (1, 2):
                r, f = rows[(codec, t)], rows[("f16", t)]
                i4 = rows.get(("int4", t))
                lines.append(f"| {codec} | {t} | {r['us']:.1f} | {f['us']:.1f} | {f['us'] / r['us']:.2f} | "
                             f"{i4['us'] if i4 else float('nan'):.1f} | {r['mb']:.2f} | {r['gbps']:.1f} | "
                             f"{r['probe']:.1f} | {r['vs']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def sweep(d):
    """{(shape, codec, threads): row} of a sweep folder, f16 from its own run."""
    out = {}
    for shape, codec, rows in runs(d):
        for t in (1, 2):
            if (codec, t) in rows and ("f16", t) in rows:
                out[(shape, codec, t)] = dict(rows[(codec, t)], f16=rows[("f16", t)]["us"])
    return out


def compare(before_dir, after_dir):
    """Codecs measured in both sweeps: time and vs f16 before and after."""
    before, after = sweep(before_dir), sweep(after_dir)
    lines = [f"before: `{os.path.basename(before_dir.rstrip('/'))}`, after: "
             f"`{os.path.basename(after_dir.rstrip('/'))}` (µs per 16K-token layer; speed-up = "
             "before / after; vs f16 = f16's time / the codec's in the same run)", "",
             "| shape | codec | threads | before µs | after µs | speed-up | vs f16 before | "
             "vs f16 after | vs probe before | vs probe after |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {b['us']:.1f} | {a['us']:.1f} | "
                     f"{b['us'] / a['us']:.2f} | {b['f16'] / b['us']:.2f} | {a['f16'] / a['us']:.2f} | "
                     f"{b['vs']:.2f} | {a['vs']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv):
    if argv[:1] == ["render"]:
        sys.stdout.write(render(argv[1]))
        return 0
    if argv[:1] == ["compare"] and len(argv) == 3:
        sys.stdout.write(compare(argv[1], argv[2]))
        return 0
    if argv[:1] == ["embed-compare"] and len(argv) == 4:
        name = ",".join(os.path.basename(x.rstrip("/")) for x in argv[2:4])
        doc_blocks.embed("decode16k_table", argv[1], "decode16k-compare", name,
                         compare(argv[2], argv[3]))
        return 0
    if len(argv) == 3 and argv[0] in ("embed", "check"):
        doc, d = argv[1], argv[2]
        if argv[0] == "embed":
            doc_blocks.embed("decode16k_table", doc, "decode16k", "", render(d))
            return 0
        root = os.path.dirname(d.rstrip("/"))

        def block(kind, name):
            if kind == "decode16k":
                return render(d)
            b, a = name.split(",")
            return compare(os.path.join(root, b), os.path.join(root, a))

        def hint(kind, name):
            if kind == "decode16k":
                return f"bench/decode16k_table.py embed {doc} {d}"
            b, a = name.split(",")
            return f"bench/decode16k_table.py embed-compare {doc} {root}/{b} {root}/{a}"

        return doc_blocks.check("decode16k_table", doc, ["decode16k", "decode16k-compare"], block,
                                hint, require_one=True)
    if len(argv) == 2 and argv[0] == "--self-test":
        return doc_blocks.self_test("decode16k_table", "decode16k", "",
                                    lambda kind, name: render(argv[1]), r"\| (\d+\.\d\d) \|")
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
