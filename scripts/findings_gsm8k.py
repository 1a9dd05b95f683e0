"""The GSM8K blocks of docs/findings.md (scripts/render_findings.py): the
table gsm8k.json holds, and the SIMD-target control, f16 run again on
another machine's target against the recorded f16 and the schemes that
ran on that target, and one scheme's answers in two GSM8K folders side by
side (gsm8k_versus)."""
import math
import pathlib

from findings_common import first_records, fmt, pct, read_lines, result_file_stem, \
    scheme_of, scheme_spellings, simd_targets, table


def no_number_answers(results, scheme, problems):
    """How many of the first `problems` problems a scheme answered with no number
    (kvq's recorded "predicted" is empty), from its results file, or "not recorded"."""
    path = pathlib.Path(results) / f"{result_file_stem(scheme)}.jsonl"
    if not path.exists():
        return "not recorded"
    return sum(1 for i, r in first_answers(path).items() if i < problems and not r.get("predicted"))


def render_gsm8k(study_dir, model, studies):
    """The GSM8K table of M/gsm8k.json, with the answers that hold no number
    from M/results/gsm8k/."""
    if model not in studies:
        raise KeyError(f"block 'gsm8k {model}': no {model}/study.json or section JSON")
    if "gsm8k" not in studies[model]:
        raise KeyError("no gsm8k section (kvq study --gsm8k-problems; gsm8k.json)")
    g = studies[model]["gsm8k"]
    results = pathlib.Path(study_dir) / model / "results" / "gsm8k"
    rows = [[f"`{s['name']}`", f"{s['correct']}/{s['problems']}", pct(s["accuracy"]),
             f"{pct(s['wilson95_low'])} - {pct(s['wilson95_high'])}",
             fmt(s["mean_generated_tokens"]), s["hit_token_limit"],
             f"{no_number_answers(results, s['name'], s['problems'])}/{s['problems']}",
             simd_targets(s.get("simd_targets", {}))] for s in g["schemes"]]
    text = (f"{g['selection']}, greedy, at most {g['max_new_tokens']} new tokens, "
            f"{'chat template' if g['chat'] else 'plain prompt'}:\n\n" +
            table(["scheme", "correct", "accuracy", "95% Wilson interval", "mean tokens",
                   "hit the limit", "answers with no number", "answers per SIMD target"], rows))
    pairs = g.get("paired", [])  # studies before session 20 lack it
    targets = {s["name"]: s.get("simd_targets", {}) for s in g["schemes"]}
    if pairs:
        rows = [[f"`{p['a']}`", f"`{p['b']}`", p["only_a_correct"], p["only_b_correct"],
                 p["both_correct"], p["neither_correct"], pvalue(p["mcnemar_exact_p"]),
                 "yes" if one_same_target(targets[p["a"]], targets[p["b"]]) else "no"]
                for p in pairs]
        text += ("\nPaired on the same problems (exact McNemar test: the chance of a split "
                 "of the problems only one scheme got right at least this uneven, if neither "
                 "scheme were better):\n\n" +
                 table(["scheme A", "scheme B", "only A right", "only B right", "both right",
                        "neither", "p", "same SIMD target"], rows))
    return text


def one_same_target(a_targets, b_targets):
    """Both schemes' answers all on one and the same SIMD target, the rule of
    kvq's same_simd_target (src/study/study_gsm8k.cc), from the schemes'
    simd_targets, so pairs recorded before kvq wrote the flag get it too."""
    return len(a_targets) == 1 and a_targets == b_targets and "" not in a_targets


def pvalue(p):
    """0.0071 -> "0.007"; below 0.001 in scientific notation (1.2e-38)."""
    return f"{p:.3f}" if p >= 1e-3 else f"{p:.1e}"


def mcnemar_exact_p(only_a, only_b):
    """Two-sided exact McNemar p, as kvq's GSM8K stage computes it
    (src/study/study_gsm8k.cc): twice the smaller binomial(n, 1/2) tail."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n <= 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def first_answers(path):
    """{problem index: its first record} in a GSM8K results file."""
    return first_records(read_lines(path), "index")


def paired_row(a, b, problems):
    """[only a right, only b right, both, neither, p] over the problems both answered."""
    both = [i for i in problems if i in a and i in b]
    only_a = sum(1 for i in both if a[i]["correct"] and not b[i]["correct"])
    only_b = sum(1 for i in both if b[i]["correct"] and not a[i]["correct"])
    right = sum(1 for i in both if a[i]["correct"] and b[i]["correct"])
    return [only_a, only_b, right, len(both) - only_a - only_b - right,
            pvalue(mcnemar_exact_p(only_a, only_b))]


def same_answers(a, b, problems):
    """["K/N" same text, "K/N" same final number] of two runs' answers over
    those of `problems` both answered."""
    done = [i for i in problems if i in a and i in b]
    return [f"{sum(a[i]['answer'] == b[i]['answer'] for i in done)}/{len(done)}",
            f"{sum(a[i]['predicted'] == b[i]['predicted'] for i in done)}/{len(done)}"]


def render_gsm8k_control(study_dir, model, studies):
    """f16 rerun into M/control-*/gsm8k/ (another SIMD target, build or batch
    schedule): how far greedy GSM8K answers move with the arithmetic alone;
    each scheme recorded on a control's target paired with that control
    instead of the recorded f16; and the controls paired with each other."""
    if "gsm8k" not in studies.get(model, {}):
        raise KeyError(f"block 'gsm8k_control {model}': no gsm8k.json")
    g = studies[model]["gsm8k"]
    problems = range(g["problems"])
    results = pathlib.Path(study_dir) / model / "results" / "gsm8k"
    recorded = first_answers(results / f"{result_file_stem('f16')}.jsonl")
    controls = {path.parent.parent.name: first_answers(path) for path in sorted(
        pathlib.Path(study_dir, model).glob(f"control-*/gsm8k/{result_file_stem('f16')}.jsonl"))}
    if not controls:
        raise KeyError(f"block 'gsm8k_control {model}': no control-*/gsm8k/ f16 results")
    schemes = {s["name"]: first_answers(results / f"{result_file_stem(s['name'])}.jsonl")
               for s in g["schemes"] if s["name"] != "f16"}

    def targets(answers):
        return {r.get("simd_target", "") for r in answers.values()}

    def on(label, answers):
        return f"{label} on {'/'.join(sorted(targets(answers))) or 'not recorded'}"

    def row(a_label, a, b_label, b):
        done = [i for i in problems if i in a and i in b]
        return [a_label, b_label, f"{sum(a[i]['correct'] for i in done)}/{len(done)}",
                f"{sum(b[i]['correct'] for i in done)}/{len(done)}"] + paired_row(a, b, done)

    header = ["A", "B", "A correct", "B correct", "only A right", "only B right", "both right",
              "neither", "p"]
    text = ""
    for folder, control in controls.items():
        done = [i for i in problems if i in control]
        same_text, same_number = same_answers(control, recorded, done)
        mine = on(f"`{folder}/` f16", control)
        rows = [row(on("recorded `f16`", recorded), recorded, mine, control)]
        rows += [row(mine, control, f"`{name}`", answers) for name, answers in schemes.items()
                 if targets(answers) == targets(control)]
        text += (f"`{folder}/`: f16 again on {len(done)} of the {g['problems']} problems; the "
                 f"same text as the recorded f16 on {same_text}, the same final "
                 f"number on {same_number}. Paired on the problems both answered:\n\n"
                 + table(header, rows) + "\n")
    names = list(controls)
    pairs = [row(on(f"`{a}/` f16", controls[a]), controls[a], on(f"`{b}/` f16", controls[b]),
                 controls[b]) + same_answers(controls[a], controls[b], problems)
             for k, a in enumerate(names) for b in names[k + 1:]]
    if pairs:
        text += ("The controls paired with each other:\n\n" +
                 table(header + ["same text", "same number"], pairs) + "\n")
    return text.rstrip("\n") + "\n"


def render_gsm8k_versus(study_dir, folders, studies):
    """`gsm8k_versus NEW,OLD`: each scheme both folders' GSM8K results hold
    (NEW/results/gsm8k/, OLD/results/gsm8k/), on the problems both answered:
    how often the two runs agree, word for word and by final number, and the
    paired split of their correctness. What one scheme's answers move by when
    only the way they were run changed."""
    new, old = folders.split(",")
    spellings = {**scheme_spellings(studies.get(old, {})), **scheme_spellings(studies.get(new, {}))}
    roots = [pathlib.Path(study_dir) / f / "results" / "gsm8k" for f in (new, old)]
    rows = []
    for path in sorted(roots[0].glob("*.jsonl")):
        if not (roots[1] / path.name).exists():
            continue
        a, b = first_answers(path), first_answers(roots[1] / path.name)
        done = sorted(i for i in a if i in b)
        if not done:
            continue
        rows.append([f"`{scheme_of(path.stem, spellings)}`", len(done),
                     f"{sum(a[i]['correct'] for i in done)}/{len(done)}",
                     f"{sum(b[i]['correct'] for i in done)}/{len(done)}"] +
                    paired_row(a, b, done) + same_answers(a, b, done))
    if not rows:
        raise KeyError(f"block 'gsm8k_versus {folders}': no scheme answered in both")
    return table(["scheme", "problems", f"`{new}/`", f"`{old}/`", "only new right",
                  "only old right", "both right", "neither", "p", "same text", "same number"],
                 rows)
