#!/usr/bin/env python3
"""The table of bench/vs_llamacpp_depth.sh from its output folder (rerunnable on
partial results: pairs whose files are missing are skipped).

  bench/depth_table.py OUT_DIR PROBE_GB_S MODEL PAIRS
"""
import json, os, re, sys
out, probe, model = sys.argv[1], float(sys.argv[2]), sys.argv[3]
pairs = [tuple(p.split(":")) for p in sys.argv[4].split(",")]
print(f"\nmodel: {model}")
print("\n| kvq KV | llama.cpp KV | test | llama.cpp t/s | kvq t/s | kvq / llama.cpp | kvq floor t/s | kvq / floor |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for ours, theirs in pairs:
    files = [f"{out}/llama_{theirs}.json", f"{out}/kvq_{ours}.md", f"{out}/plan_{ours}.json"]
    if not all(os.path.exists(f) and os.path.getsize(f) > 0 for f in files):
        print(f"| {ours} | {theirs} | (not measured: missing or empty result files) | | | | | |")
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
        floor = ""
        if test.startswith("tg") and bpt:
            t = probe * 1e9 / (weights + bpt * (depth + 1))
            floor = f"{t:.1f} | {kvq[key] / t:.2f}"
        else:
            floor = "- | -"
        print(f"| {ours} | {theirs} | {test} @ d{depth} | {llama[key]:.2f} | {kvq[key]:.2f} | "
              f"{kvq[key] / llama[key]:.2f} | {floor} |")
