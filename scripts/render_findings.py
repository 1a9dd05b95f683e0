#!/usr/bin/env python3
"""Writes the generated blocks of docs/findings.md from the study JSONs that ship.

docs/findings.md mixes prose with blocks the prose may not edit by hand:

    <!-- generated: e2e SmolLM2-135M-Instruct.Q4_1 -->
    ...tables made from docs/study/SmolLM2-135M-Instruct.Q4_1/study.json...
    <!-- end generated -->

Block kinds: `run M`, `structure M`, `claims M`, `e2e M`, `context_kl M`,
`needle M`, `gsm8k M` (one model's study; the last three also from
M/context_kl.json, M/needle.json, M/gsm8k.json: stages run on their own),
`compare` (every shipped model side by side), `frontier` (per model, the schemes no smaller
cache beats on KL), `context_kl_sizes` (KL by
context length, every model that has run the stage, smallest first), `progress` (what the
resumable runs have recorded under M/results/ so far, per scheme) and `needle_recorded M`
(every needle trial recorded for M so far, per scheme, task and context, with what the
wrong answers start with; scripts/findings_needle.py), `gsm8k_control M` (f16's GSM8K answers
rerun on another SIMD target into M/control-*/, against the recorded f16 and paired with the
schemes that ran on that target; scripts/findings_gsm8k.py), `gsm8k_versus NEW,OLD` (each
scheme both folders' GSM8K results hold, run against run: same text, same number, paired
correctness). `--write` fills the blocks
in place; `--check` (a ctest) fails when a block differs from what the JSON
gives, or when a paragraph quotes a decimal number (3.14, 2.5x, 96.3%) or a count
("49 of 50", "25/25": a K/N of a table) that no
generated block of its own subsection, of its section's opening, of a
subsection about a model it names ("on SmolLM2"), or of a section it names
("section 3", "§4"), contains, so a figure cannot go stale silently.
Usage: render_findings.py --write|--check FINDINGS.md STUDY_DIR | --self-test STUDY_DIR
"""
import json
from collections import Counter
import math
import pathlib
import re
import statistics
import sys

from findings_common import first_records, fmt, pct, read_lines, result_file_stem, scheme_of, \
    scheme_spellings, simd_targets, table, wilson95
from findings_gsm8k import mcnemar_exact_p, no_number_answers, one_same_target, render_gsm8k, \
    render_gsm8k_control, render_gsm8k_versus
from findings_needle import MISS_KINDS, cell_rate, f16_passing, miss_kind, needle_cells, \
    needle_coverage, needle_tally, render_needle, render_needle_depth, render_needle_recorded

BLOCK = re.compile(r"(<!-- generated: ([a-z0-9_-]+)(?: ([^ ]+))? -->\n)(.*?)(<!-- end generated -->)",
                   re.S)
# A figure: 3.14, 2.5x, 96.3%; not a name such as 1.5B or Qwen2.5, nor a
# needle depth ("depth 1.0"), which is a coordinate of the grid, not a result.
DECIMAL = re.compile(r"(?<![\w.])(?<!depth )\d+\.\d+(?![\dA-Za-wyz])")
# A count: "49 of 50", "1 of its first 11", "25/25" in prose, "49/50" in a block.
COUNT = re.compile(r"(?<![\w./])(\d+)(?:/|\s+of\s+(?:(?:its|the|their|first|all)\s+)*)(\d+)"
                   r"(?![\w/]|\.\d)")
BLOCK_COUNT = re.compile(r"(?<![\w./])(\d+)/(\d+)(?![\w/]|\.\d)")


def figures(text, counts):
    """The decimals and counts ("K/N") a text quotes; `counts` reads counts as
    prose writes them, or else as tables do."""
    return set(DECIMAL.findall(text)) | {f"{k}/{n}" for k, n in counts.findall(text)}


def head_ratio(channel_means):
    """Largest channel's mean |x| over the head's median channel."""
    med = statistics.median(channel_means)
    return max(channel_means) / med if med > 0 else float("inf")


def render_run(study):
    m, t = study["model"], study["text"]
    rows = [["model file", pathlib.Path(m["path"]).name],
            ["architecture", m["architecture"]],
            ["parameters", f"{m['parameters']:,}"],
            ["layers / heads / KV heads / head_dim",
             f"{m['layers']} / {m['heads']} / {m['kv_heads']} / {m['head_dim']}"],
            ["context", m["context"]],
            ["perplexity windows", f"{t['perplexity_windows']} x {t['perplexity_context']} tokens"],
            ["capture", f"{study['outliers']['capture_tokens']} tokens"],
            ["schemes", len(study["schemes"])],
            ["run time", f"{study['timings_seconds']['total']:.0f} s"],
            ["made", study["created_utc"]]]
    if "end_to_end_dir" in study:  # a resumed run reuses the schemes recorded by earlier ones
        rows[-2][0] = "run time (the last run)"
        rows.append(["end-to-end results", f"{study['end_to_end_dir']}, schemes per SIMD target: " +
                     simd_targets(Counter(s.get("simd_target", "") for s in study["schemes"]))])
    # The binary's own path is the machine's; show it as a user types it.
    command = re.sub(r"^\S*/kvq ", "kvq ", study["command"])
    return table(["", ""], rows) + "\nCommand:\n\n```sh\n" + command + "\n```\n"


def render_structure(study):
    out = study["outliers"]
    bias = out["k_bias"]
    rows = []
    for layer in out["layers"]:
        i = layer["layer"]
        pre = [head_ratio(h) for h in layer["k_pre_rope_channel_mean_abs"]]
        post = [head_ratio(h) for h in layer["k_post_rope_channel_mean_abs"]]
        val = [head_ratio(h) for h in layer["v_channel_mean_abs"]]
        n_pre = sum(len(c) for c in layer["k_pre_rope_outlier_channels"])
        n_post = sum(len(c) for c in layer["k_post_rope_outlier_channels"])
        ratio = bias["ratio_to_median"][i] if bias["ratio_to_median"] else None
        rows.append([i, f"{fmt(max(pre))}x ({n_pre})", f"{fmt(max(post))}x ({n_post})",
                     f"{fmt(max(val))}x", fmt(ratio) + ("x" if ratio is not None else ""),
                     pct(layer["sink_mass"]), len(layer["sinks"])])
    text = table(["layer", "K pre-RoPE: top/median (outlier channels)", "K post-RoPE",
                  "V top/median", "k_proj bias / median layer", "token-0 mass", "sinks"], rows)
    spikes = ", ".join(str(s) for s in bias["spike_layers"]) or "none"
    text += (f"\nOutlier rule: {out['outlier_rule']}. Bias spike rule: {bias['spike_rule']}; "
             f"spike layers: {spikes}. Sink rule: {out['sink_detection_rule']}.\n")
    return text


def render_claims(study):
    rows = []
    for c in study["fake_quant"]["claims"]:
        reported = fmt(c["reported_ratio"]) + "x" if c.get("reported_ratio") else ""
        rows.append([c["id"], c["family"], c["bits"], c["metric"], fmt(c["baseline_value"]),
                     fmt(c["value"]), fmt(c["ratio"]) + "x", reported,
                     "holds" if c["holds"] else "**fails**"])
    return table(["claim", "quantizers", "bits", "metric", "worse row", "better row", "ratio",
                  "write-up's ratio", "verdict"], rows)


def recall_cell(scheme):
    cells = scheme.get("recall") or []
    if not cells:
        return ""
    return f"{sum(c['correct'] for c in cells)}/{sum(c['trials'] for c in cells)}"


def render_e2e(study):
    base = next(s for s in study["schemes"] if s["baseline"])
    rows = []
    for s in study["schemes"]:
        dppl = (s["ppl"] / base["ppl"] - 1) if base["ppl"] else float("nan")
        rows.append([f"`{s['name']}`", fmt(s["bits_per_value"]), fmt(s["compression_vs_f16"]) + "x",
                     fmt(s["ppl"], 4), f"{100 * dppl:+.2f}%", fmt(s["kl_mean"]), fmt(s["kl_p99"]),
                     pct(s["top1_agreement"]), recall_cell(s)])
    return table(["scheme", "bits/value", "vs f16", "PPL", "PPL vs f16", "KL mean", "KL p99",
                  "same top-1", "passkey"], rows)


def render_compare(studies):
    names = [n for n in studies if "schemes" in studies[n]]  # the models with a core study
    order = []
    for study in (studies[n] for n in names):
        for s in study["schemes"]:
            if s["name"] not in order:
                order.append(s["name"])
    rows = []
    for scheme in order:
        row = [f"`{scheme}`"]
        for n in names:
            s = next((x for x in studies[n]["schemes"] if x["name"] == scheme), None)
            row.append(f"{fmt(s['kl_mean'])} / {pct(s['top1_agreement'])}" if s else "")
        rows.append(row)
    return table(["scheme"] + [f"{n}: KL / top-1" for n in names], rows)


def render_context_kl(study):
    if "context_kl" not in study:
        raise KeyError("no context_kl section (kvq study --context-kl; context_kl.json)")
    c = study["context_kl"]
    rows = []
    for s in c["schemes"]:
        if s["baseline"]:
            continue
        by_length = {p["context"]: p for p in s["points"]}
        rows.append([f"`{s['name']}`", fmt(s["bits_per_value"])] +
                    [f"{fmt(by_length[n]['kl_mean'])} / {pct(by_length[n]['top1_agreement'])}"
                     if n in by_length else "" for n in c["lengths"]])
    text = table(["scheme", "bits/value"] + [f"{n}: KL / top-1" for n in c["lengths"]], rows)
    longest = max(c["lengths"])
    ppl = [f"{s['name']} {fmt(p['ppl'])}" for s in c["schemes"] for p in s["points"]
           if p["context"] == longest and "ppl" in p]
    if ppl:
        text += f"\nPerplexity at {longest} (the same windows): {', '.join(ppl)}.\n"
    best = c.get("best_2bit")
    return text + (f"\nBest 2-bit scheme at the longest length: `{best}`.\n" if best else "")


def render_context_kl_sizes(studies):
    """One row per (scheme, model): how the error grows with context across sizes."""
    names = [n for n in studies if "context_kl" in studies[n]]
    if not names:
        raise KeyError("block 'context_kl_sizes': no model has a context_kl section")
    lengths = sorted({n for m in names for n in studies[m]["context_kl"]["lengths"]})
    order = []
    for m in names:
        for s in studies[m]["context_kl"]["schemes"]:
            if not s["baseline"] and s["name"] not in order:
                order.append(s["name"])
    rows = []
    for scheme in order:
        for m in names:
            s = next((x for x in studies[m]["context_kl"]["schemes"] if x["name"] == scheme), None)
            if s is None:
                continue
            kl = {p["context"]: p["kl_mean"] for p in s["points"]}
            rows.append([f"`{scheme}`", m] + [fmt(kl[n]) if n in kl else "" for n in lengths])
    return table(["scheme", "model"] + [f"KL @ {n}" for n in lengths], rows)


def render_frontier(studies):
    """Per model, the schemes no smaller cache beats on KL (section 3's runs),
    largest first, with their needle recall pooled where f16 passes."""
    rows = []
    for name, st in studies.items():
        if "schemes" not in st:
            continue
        needle = {s["name"]: s for s in st["needle"]["schemes"]} if "needle" in st else {}
        passing = set(f16_passing(st["needle"])) if needle else set()
        best, kept = math.inf, []
        for s in sorted(st["schemes"], key=lambda s: (s["bits_per_value"], s["kl_mean"])):
            if s["kl_mean"] < best:
                best = s["kl_mean"]
                kept.append(s)
        for s in reversed(kept):
            cells = [c for c in needle[s["name"]]["cells"] if (c["task"], c["context"]) in passing] \
                if s["name"] in needle else []
            rows.append([name, f"`{s['name']}`", fmt(s["bits_per_value"]),
                         fmt(s["compression_vs_f16"]) + "x", fmt(s["kl_mean"]),
                         pct(s["top1_agreement"]), cell_rate(cells)])
    return table(["model", "scheme", "bits/value", "vs f16", "KL mean", "same top-1",
                  "needle where f16 passes"], rows)


def render_coverage(studies, study_dir):
    """Which of the issue's measurements each model has, from the files that ship."""
    peers_dir = pathlib.Path(study_dir).parent / "peers"
    rows = {"1. structure (outliers, biases, sinks)": [], "2. the write-up's table": [],
            "3. end to end per scheme": [], "4. needle in a haystack": [],
            "5. GSM8K": [], "6. KL by context length": [], "7. the peers' caches": []}
    # A stage's archive (M.gsm8k-v1/) is no model's study.
    models = [name for name in studies if (pathlib.Path(study_dir) / name / "study.json").exists()]
    for name in models:
        st = studies[name]
        cells = rows.values()
        col = ["yes" if "outliers" in st else "not run",
               "yes" if "fake_quant" in st else "not run",
               f"{len(st['schemes'])} schemes" if "schemes" in st else "not run",
               needle_coverage(st["needle"]) if "needle" in st else "not run",
               (f"{st['gsm8k']['problems']} problems, {len(st['gsm8k']['schemes'])} schemes"
                if "gsm8k" in st else "under way" if
                (pathlib.Path(study_dir) / name / "results" / "gsm8k").is_dir() else "not run"),
               (", ".join(str(x) for x in st["context_kl"]["lengths"]) + " tokens"
                if "context_kl" in st else "not run")]
        peers = peers_dir / name / "peers.json"
        if peers.exists():
            p = json.loads(peers.read_text())
            engines = sorted({r["engine"] for r in p["rows"]})
            col.append(f"{p['chunks']} windows of {p['n_ctx']}; {', '.join(engines)}")
        else:
            col.append("not run")
        for values, value in zip(cells, col):
            values.append(value)
    return table(["measurement"] + models, [[k] + v for k, v in rows.items()])


def render_context_kl_recorded(study_dir, model, studies):
    """Context-KL points recorded under M/results/context_kl/ at lengths
    context_kl.json does not hold yet (it is rewritten once every scheme has
    the length); schemes named as the model's JSONs spell them."""
    root = pathlib.Path(study_dir) / model / "results" / "context_kl"
    shipped = set(studies.get(model, {}).get("context_kl", {}).get("lengths", []))
    spellings = scheme_spellings(studies.get(model, {}))
    points = [(scheme_of(f.stem, spellings), p) for f in root.glob("*.jsonl")
              for p in read_lines(f) if p["context"] not in shipped]
    rows = [[f"`{name}`", p["context"], fmt(p["kl_mean"]), fmt(p["kl_p99"]),
             pct(p["top1_agreement"]), fmt(p["ppl"]), p.get("simd_target", "not recorded")]
            for name, p in sorted(points, key=lambda np: (np[0] != "f16", np[0], np[1]["context"]))]
    if not rows:
        return "Every recorded point is in `context_kl.json`.\n"
    return table(["scheme", "length", "KL mean", "KL p99", "same top-1", "PPL", "SIMD target"],
                 rows)


# The resumable stages with one record per unit: (stage folder, what a
# record is, the key that names it: a unit recorded twice counts once, as kvq
# counts it). end_to_end writes its records in one go: done or not begun.
PROGRESS_STAGES = (("gsm8k", "problems", "index"), ("context_kl", "lengths", "context"),
                   ("end_to_end", "", ""))


def render_progress(study_dir, studies):
    """What the resumable runs have recorded so far (M/results/, bench/study_long.sh)."""
    rows = []
    for folder in sorted(p for p in pathlib.Path(study_dir).iterdir() if (p / "results").is_dir()):
        results, spellings = folder / "results", scheme_spellings(studies.get(folder.name, {}))
        for stage, unit, key in PROGRESS_STAGES:
            for f in sorted((results / stage).glob("*.jsonl")):
                recs = read_lines(f)
                if key:
                    recs = list(first_records(recs, key).values())
                count = f"{len(recs)} {unit}" if unit else "done" if recs else "0 runs"
                rows.append((folder.name, stage, scheme_of(f.stem, spellings), count, recs))
        for d in sorted(p for p in (results / "needle").glob("*") if p.is_dir()):
            cells = {f: list(first_records(records, "trial").values())
                     for f, records in needle_cells(d).items()}
            recs = [r for records in cells.values() for r in records]
            rows.append((folder.name, "needle", scheme_of(d.name, spellings),
                         f"{len(recs)} trials in {len(cells)} cells; {needle_tally(cells)}", recs))
    out = [[model, stage, f"`{scheme}`", count,
            simd_targets(Counter(r.get("simd_target", "") for r in recs))]
           for model, stage, scheme, count, recs in rows]
    if not out:
        return "No resumable run has recorded anything yet.\n"
    return table(["model", "stage", "scheme", "recorded", "per SIMD target"], out)


RENDERERS = {"run": render_run, "structure": render_structure, "claims": render_claims,
             "e2e": render_e2e, "context_kl": render_context_kl, "needle": render_needle,
             "needle_depth": render_needle_depth}
# Stages run on their own (kvq study --no-core ...) ship as SECTION.json beside
# the model's study.json, or alone for a model without a core study.
EXTRA_SECTIONS = ("context_kl", "needle", "gsm8k")


def load_studies(study_dir):
    studies = {}
    for folder in sorted(p for p in pathlib.Path(study_dir).iterdir() if p.is_dir()):
        core = folder / "study.json"
        study = json.loads(core.read_text()) if core.exists() else {}
        for section in EXTRA_SECTIONS:
            extra = folder / f"{section}.json"
            if extra.exists() and section not in study:
                study[section] = json.loads(extra.read_text())[section]
        if study:
            studies[folder.name] = study
    return studies


def render(doc, studies, study_dir):
    """The document with every block filled; raises on an unknown kind or model."""
    def fill(m):
        kind, model = m.group(2), m.group(3)
        if kind == "compare":
            body = render_compare(studies)
        elif kind == "context_kl_sizes":
            body = render_context_kl_sizes(studies)
        elif kind == "progress":
            body = render_progress(study_dir, studies)
        elif kind == "needle_recorded":
            body = render_needle_recorded(study_dir, model, studies)
        elif kind == "gsm8k":
            body = render_gsm8k(study_dir, model, studies)
        elif kind == "gsm8k_control":
            body = render_gsm8k_control(study_dir, model, studies)
        elif kind == "gsm8k_versus":
            body = render_gsm8k_versus(study_dir, model, studies)
        elif kind == "context_kl_recorded":
            body = render_context_kl_recorded(study_dir, model, studies)
        elif kind == "coverage":
            body = render_coverage(studies, study_dir)
        elif kind == "frontier":
            body = render_frontier(studies)
        elif kind in RENDERERS:
            if model not in studies:
                raise KeyError(f"block '{kind} {model}': no {model}/study.json or section JSON")
            body = RENDERERS[kind](studies[model])
        else:
            raise KeyError(f"unknown block kind '{kind}'")
        return m.group(1) + body + m.group(5)
    return BLOCK.sub(fill, doc)


# A paragraph may quote another section's figures when it names that section:
# "section 3", "sections 3 and 4", "§4".
SECTION_REF = re.compile(r"(?:§|\b[Ss]ections? )(\d+(?:(?:, | and | or )\d+)*)")


def sections(doc):
    """{key: text} per top-level section: "## 3. End to end" has key "3", "## The runs"
    the key "The runs"."""
    parts = {}
    for part in re.split(r"(?m)^(?=## )", doc):
        numbered = re.match(r"## (\d+)\.", part)
        if numbered:
            key = numbered.group(1)
        else:
            key = part.split("\n", 1)[0][3:] if part.startswith("## ") else "the preamble"
        parts[key] = parts.get(key, "") + part
    return parts


# A model a subsection is about, and a paragraph names: "SmolLM2", "0.5B", "135M".
MODEL_ALIAS = re.compile(r"SmolLM2|(?<![\w.])\d+(?:\.\d+)?[BM]\b")


def subsections(section):
    """[(aliases, text)]: the section's opening (before its first "### ", aliases
    empty) and each subsection, with the model names its heading carries."""
    parts = re.split(r"(?m)^(?=### )", section)
    return [(set(MODEL_ALIAS.findall(p.split("\n", 1)[0])) if p.startswith("### ") else set(), p)
            for p in parts]


def block_figures(text):
    return figures("".join(m.group(4) for m in BLOCK.finditer(text)), BLOCK_COUNT)


def prose_numbers_missing(doc):
    """Decimal figures and counts in the prose that no generated block it may quote holds.

    A paragraph (or list item) may quote the blocks of its own subsection, of
    its section's opening, of the section's subsections about a model it
    names ("on SmolLM2", "the 0.5B") and of any section it names ("section
    3", "§4"). So a figure quoted beside the wrong table, or under one
    model's heading from another model's table without naming it, or one
    that matches an unrelated block elsewhere in the page, does not pass."""
    subs_of = {key: [(aliases, sub, block_figures(sub)) for aliases, sub in subsections(text)]
               for key, text in sections(doc).items()}
    held = {key: set().union(*(figs for _, _, figs in subs)) for key, subs in subs_of.items()}
    missing = set()
    for key, subs in subs_of.items():
        for aliases, sub, own in subs:
            prose = re.sub(r"```.*?```", "", BLOCK.sub("", sub), flags=re.S)
            for paragraph in re.split(r"\n\s*\n|\n(?=- )", prose):
                named = {n for refs in SECTION_REF.findall(paragraph)
                         for n in re.findall(r"\d+", refs)}
                models = set(MODEL_ALIAS.findall(paragraph))
                have = own | subs[0][2] | set().union(*(held.get(k, set()) for k in named))
                have = have.union(*(figs for a, _, figs in subs if a & models))
                where = f"section {key}" if key.isdigit() else key
                if aliases:
                    where += ", " + sub.split("\n", 1)[0][4:]
                missing |= {f"{n} ({where})"
                            for n in figures(re.sub(r"`[^`]*`", "", paragraph), COUNT)
                            if n not in have}
    return sorted(missing)


def self_test(study_dir):
    """--check must fail on a stale block and on a prose figure its section's blocks lack."""
    import tempfile
    studies = load_studies(study_dir)
    model = next(n for n in studies if "schemes" in studies[n])
    good = render(f"<!-- generated: e2e {model} -->\n<!-- end generated -->\n", studies, study_dir)
    figure = DECIMAL.findall(good)[-1]
    elsewhere = f"## 1. Tables\n\n{good}\n## 2. Prose\n\nThe KL is {figure}"
    other_model = f"## 1. Tables\n\n### Model-135M\n\n{good}\n### Model-0.5B\n\nThe KL is {figure}"
    cases = {"fresh": (good, 0), "stale": (good.replace("|", "| 0.123 |", 3), 1),
             "unbacked figure": (good + "The KL is 98.765.\n", 1),
             "figure from an unnamed section": (elsewhere + ".\n", 1),
             "figure from a named section": (elsewhere + " (section 1).\n", 0),
             "figure from another model's subsection": (other_model + ".\n", 1),
             "figure from a named model's subsection": (other_model + " on the 135M.\n", 0)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (doc, want) in cases.items():
            path = pathlib.Path(tmp) / "doc.md"
            path.write_text(doc)
            if (main(["", "--check", str(path), study_dir]) != 0) != bool(want):
                print(f"self-test: the {name} document was {'accepted' if want else 'rejected'}")
                return 1
    with tempfile.TemporaryDirectory() as tmp:  # progress counts complete lines only
        gsm = pathlib.Path(tmp) / "m" / "results" / "gsm8k"
        gsm.mkdir(parents=True)
        (gsm / "f16-0123abcd.jsonl").write_text(
            '{"index": 0, "simd_target": "AVX2"}\n{"index": 1, "simd_target": "AVX2"}\n{"ind')
        needle = pathlib.Path(tmp) / "m" / "results" / "needle" / "kivi4-0123abcd"
        needle.mkdir(parents=True)
        (needle / "single_repeat_c1024_d0.000.jsonl").write_text(
            '{"trial": 0, "correct": true}\n{"trial": 1, "correct": false}\n')
        (needle / "multikey_repeat_c2048_d0.500.jsonl").write_text(
            '{"trial": 0, "correct": true}\n{"trial": 1, "corr')
        for want in ("| m | gsm8k | `f16` | 2 problems | AVX2 2 |",
                     "| m | needle | `kivi4` | 3 trials in 2 cells; correct at 1024 1/2, 2048 1/1 |"):
            if want not in render_progress(tmp, {}):
                print("self-test: the progress block miscounted:\n" + render_progress(tmp, {}))
                return 1
        repeated = needle.parent / "int2-0123abcd"  # a trial recorded twice counts once, first
        repeated.mkdir()
        (repeated / "single_needle_c1024_d0.250.jsonl").write_text(
            '{"trial": 0, "correct": true}\n{"trial": 0, "correct": false}\n')
        kl = pathlib.Path(tmp) / "m" / "results" / "context_kl"  # lengths not yet shipped only
        kl.mkdir(parents=True)
        point = ('{"context": %d, "kl_mean": 0.25, "kl_p99": 1.5, "top1_agreement": 0.5, '
                 '"ppl": 9.0}\n')
        (kl / "kivi2-0123abcd.jsonl").write_text(point % 512 + point % 1024 + '{"cont')
        kl_rows = render_context_kl_recorded(tmp, "m", {"m": {"context_kl": {"lengths": [512]}}})
        if "| `kivi2` | 1024 | 0.250 | 1.50 | 50.0% | 9.00 | not recorded |" not in kl_rows or \
                "| 512 |" in kl_rows:
            print("self-test: the recorded context-KL block kept the wrong points:\n" + kl_rows)
            return 1
        if "| m | needle | `int2` | 1 trials in 1 cells; correct at 1024 1/1 |" not in \
                render_progress(tmp, {}):
            print("self-test: the progress block counted a repeated trial twice:\n" +
                  render_progress(tmp, {}))
            return 1
        recorded = render_needle_recorded(tmp, "m", {})
        for want in ("| `int2` | 1024 | - | 1/1 | - | 1/1 (100.0%) | 0 | 0 | 0 |",
                     "| `kivi4` | 1024 | 1/2 | - | - | 1/2 (50.0%) | 0 | 0 | 1 |",
                     "| `kivi4` | 2048 | - | - | 1/1 | 1/1 (100.0%) | 0 | 0 | 0 |",
                     "| `kivi4` | all | 1/2 | - | 1/1 | 2/3 (66.7%) | 0 | 0 | 1 |"):
            if want not in recorded:
                print("self-test: the recorded-needle block miscounted:\n" + recorded)
                return 1
    # What a wrong needle answer starts with; digits inside words are text.
    for answer, kind in ((" 8750111.", 0), (" 266940.", 1), (" for-329.", 2), ("", 2)):
        if miss_kind({"answer": answer, "values": ["8750011"]}) != MISS_KINDS[kind]:
            print(f"self-test: the miss {answer!r} is not '{MISS_KINDS[kind]}'")
            return 1
    with tempfile.TemporaryDirectory() as tmp:  # GSM8K: the first record of each of the first N
        (pathlib.Path(tmp) / f"{result_file_stem('int2')}.jsonl").write_text(
            '{"index": 0, "predicted": ""}\n{"index": 1, "predicted": "5"}\n'
            '{"index": 0, "predicted": "7"}\n{"index": 5, "predicted": ""}\n')
        if no_number_answers(tmp, "int2", 2) != 1 or no_number_answers(tmp, "f16", 2) != \
                "not recorded":
            print("self-test: the GSM8K answers with no number were miscounted")
            return 1
    # A count in the prose ("49 of 50", "25/25") must be a K/N of a block it may quote.
    counted = "## 1. A\n\n<!-- generated: progress -->\n| a | 49/50 | 3 |\n<!-- end generated -->\n"
    for prose, want in (("It answers 49 of 50.", []), ("It answers 49/50.", []),
                        ("It answers 48 of its 50.", ["48/50 (section 1)"]),
                        ("It answers 1 of its first 11.", ["1/11 (section 1)"]),
                        ("It answers 48 of\n  50.", ["48/50 (section 1)"]),
                        ("It answers 9/50.", ["9/50 (section 1)"])):
        if prose_numbers_missing(counted + "\n" + prose + "\n") != want:
            print(f"self-test: the prose count in {prose!r} was judged wrongly")
            return 1
    # Folder names kvq wrote (tests/study/study_tasks_test.cc pins the same three).
    for name, stem in (("int4+rot", "int4_rot-2093aa04"), ("f16/int4", "f16_int4-1f9d758c"),
                       ("policy:docs/study/policies/int4_layer0.txt",
                        "policy_docs_study_policies_int4_layer0.txt-2b2511d7")):
        if result_file_stem(name) != stem or scheme_of(stem, {stem: name}) != name:
            print(f"self-test: {name} does not map to and from its results stem {stem}")
            return 1
    # The depth grid pools only the (task, context) pairs f16 passes.
    cell = {"trials": 2, "depth": 0.5}
    grid = {"needle": {"contexts": [1024, 2048], "depths": [0.5], "trials": 2, "per_task": [
        {"task": "a", "f16_passing_contexts": [1024, 2048]},
        {"task": "b", "f16_passing_contexts": [1024]}], "schemes": [{"name": "int4", "cells": [
            dict(cell, task="a", context=1024, correct=2), dict(cell, task="b", context=1024,
                                                                 correct=1),
            dict(cell, task="a", context=2048, correct=0), dict(cell, task="b", context=2048,
                                                                 correct=2)]}]}}
    depth = render_needle_depth(grid)
    for want in ("(2 at 1024, 1 at 2048;", "| `int4` | 1024 | 3/4 | 75.0% (3/4) |",
                 "| `int4` | 2048 | 0/2 | 0.0% (0/2) |"):
        if want not in depth:
            print("self-test: the depth grid pooled the wrong cells:\n" + depth)
            return 1
    # The frontier keeps a scheme only if every smaller cache (or as small) has a higher KL.
    toy = {"schemes": [dict(name=n, bits_per_value=b, kl_mean=k, compression_vs_f16=16 / b,
                            top1_agreement=1.0)
                       for n, b, k in (("f16", 16, 0.0), ("big", 9, 0.3), ("mid", 8, 0.1),
                                       ("tie", 8, 0.2), ("low", 4, 0.5))]}
    if re.findall(r"\| m \| `(\w+)`", render_frontier({"m": toy})) != ["f16", "mid", "low"]:
        print("self-test: the frontier kept the wrong schemes:\n" + render_frontier({"m": toy}))
        return 1
    if fmt(head_ratio([0.0, 0.0, 1.0])) != "inf":  # a dead head must render, not raise
        print("self-test: a head with median channel 0 did not render as inf")
        return 1
    # The needle block's interval must be the one kvq's GSM8K stage computes in C++.
    for gsm8k in pathlib.Path(study_dir).glob("*/gsm8k.json"):
        for scheme in json.loads(gsm8k.read_text())["gsm8k"]["schemes"]:
            low, high = wilson95(scheme["correct"], scheme["problems"])
            if abs(low - scheme["wilson95_low"]) > 1e-9 or abs(high - scheme["wilson95_high"]) > 1e-9:
                print(f"self-test: wilson95 differs from {gsm8k} for {scheme['name']}")
                return 1
    with tempfile.TemporaryDirectory() as tmp:  # the SIMD-target control, partly run
        def answers(folder, name, target, records):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{result_file_stem(name)}.jsonl").write_text("".join(
                json.dumps({"index": i, "correct": c, "answer": a, "predicted": a,
                            "simd_target": target}) + "\n" for i, c, a in records))
        results = pathlib.Path(tmp) / "m" / "results" / "gsm8k"
        answers(results, "f16", "AVX2", [(0, True, "a"), (1, False, "b"), (2, True, "c")])
        answers(results, "int8", "AVX3", [(0, False, "x"), (1, True, "y"), (2, True, "c")])
        answers(results.parent.parent / "control-x" / "gsm8k", "f16", "AVX3",
                [(0, True, "a"), (1, True, "y")])
        answers(results.parent.parent / "control-y" / "gsm8k", "f16", "AVX2",
                [(0, False, "z"), (1, True, "y"), (2, True, "c")])
        control = render_gsm8k_control(tmp, "m", {"m": {"gsm8k": {"problems": 3, "schemes": [
            {"name": "f16"}, {"name": "int8"}]}}})
        for want in ("f16 again on 2 of the 3 problems; the same text as the recorded f16 on 1/2",
                     "| recorded `f16` on AVX2 | `control-x/` f16 on AVX3 | 1/2 | 2/2 | 0 | 1 | 1 "
                     "| 0 | 1.000 |",
                     "| `control-x/` f16 on AVX3 | `int8` | 2/2 | 1/2 | 1 | 0 | 1 | 0 | 1.000 |",
                     "| recorded `f16` on AVX2 | `control-y/` f16 on AVX2 | 2/3 | 2/3 | 1 | 1 | 1 "
                     "| 0 | 1.000 |",
                     "| `control-x/` f16 on AVX3 | `control-y/` f16 on AVX2 | 2/2 | 1/2 | 1 | 0 | 1 "
                     "| 0 | 1.000 | 1/2 | 1/2 |"):
            if want not in control:
                print("self-test: the GSM8K control block miscounted:\n" + control)
                return 1
        answers(pathlib.Path(tmp) / "n" / "results" / "gsm8k", "f16", "AVX3",
                [(0, True, "a"), (1, True, "q"), (2, False, "r"), (3, True, "s")])
        versus = render_gsm8k_versus(tmp, "n,m", {"m": {"gsm8k": {"schemes": [{"name": "f16"}]}}})
        want = "| `f16` | 3 | 2/3 | 2/3 | 1 | 1 | 1 | 0 | 1.000 | 1/3 | 1/3 |"
        if want not in versus or "int8" in versus:
            print("self-test: the GSM8K versus block miscounted:\n" + versus)
            return 1
    # The control's McNemar p must be the one kvq's GSM8K stage computes in C++.
    for gsm8k in pathlib.Path(study_dir).glob("*/gsm8k.json"):
        for pair in json.loads(gsm8k.read_text())["gsm8k"].get("paired", []):
            p = mcnemar_exact_p(pair["only_a_correct"], pair["only_b_correct"])
            if abs(p - pair["mcnemar_exact_p"]) > 1e-9 * max(p, 1e-300):
                print(f"self-test: McNemar p differs from {gsm8k} for {pair['a']} / {pair['b']}")
                return 1
    # The paired table's "same SIMD target" must be kvq's own flag where kvq wrote one.
    for gsm8k in pathlib.Path(study_dir).glob("**/gsm8k.json"):
        g = json.loads(gsm8k.read_text())["gsm8k"]
        targets = {s["name"]: s.get("simd_targets", {}) for s in g["schemes"]}
        for pair in g.get("paired", []):
            if "same_simd_target" in pair and pair["same_simd_target"] != one_same_target(
                    targets[pair["a"]], targets[pair["b"]]):
                print(f"self-test: same SIMD target differs from {gsm8k} for {pair['a']} / {pair['b']}")
                return 1
    if one_same_target({"AVX2": 3}, {"AVX3": 3}) or not one_same_target({"AVX3": 2}, {"AVX3": 2}) \
            or one_same_target({"AVX3": 1, "AVX2": 1}, {"AVX3": 1, "AVX2": 1}):
        print("self-test: one_same_target misjudges a toy pair")
        return 1
    if wilson95(0, 25)[0] > 1e-12 or wilson95(25, 25)[1] < 1 - 1e-12:
        print("self-test: wilson95 does not reach 0 and 1 at the ends")
        return 1
    print("self-test: ok")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) != 4 or argv[1] not in ("--write", "--check"):
        print(__doc__)
        return 2
    path, studies = pathlib.Path(argv[2]), load_studies(argv[3])
    if not studies:
        print(f"no */study.json under {argv[3]}")
        return 1
    doc = path.read_text()
    try:
        new = render(doc, studies, argv[3])
    except KeyError as e:
        print(f"{path}: {e.args[0]}")
        return 1
    missing = prose_numbers_missing(new)
    if argv[1] == "--write":
        path.write_text(new)
    elif new != doc:
        print(f"{path}: generated blocks differ from the study JSON; run "
              f"scripts/render_findings.py --write {argv[2]} {argv[3]}")
        return 1
    if missing:
        print(f"{path}: the prose quotes numbers that no generated block of its subsection, "
              f"its section's opening, a model or a section it names holds: {', '.join(missing)}")
        return 1
    print(f"{path}: {len(BLOCK.findall(new))} generated blocks match {len(studies)} studies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
