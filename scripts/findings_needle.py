"""The needle-in-a-haystack blocks of docs/findings.md (scripts/render_findings.py):
the grid needle.json holds, and every trial recorded under M/results/needle/ so far."""
from collections import Counter
import pathlib
import re

from findings_common import first_records, pct, read_lines, scheme_of, scheme_spellings, \
    simd_targets, table, wilson95


def cell_rate(cells):
    correct, trials = sum(c["correct"] for c in cells), sum(c["trials"] for c in cells)
    return f"{pct(correct / trials)} ({correct}/{trials})" if trials else "not run"


def f16_passing(n):
    """The (task, context) pairs where f16 passes: the only ones other schemes run."""
    return [(t["task"], c) for t in n["per_task"] for c in t["f16_passing_contexts"]]


def render_needle(study):
    if "needle" not in study:
        raise KeyError("no needle section (kvq study --niah; needle.json)")
    n = study["needle"]
    f16 = next(s for s in n["schemes"] if s["name"] == "f16")
    rows = [[t] + [cell_rate([c for c in f16["cells"] if c["task"] == t and c["context"] == ctx])
                   for ctx in n["contexts"]] for t in n["tasks"]]
    targets = sum((Counter(c.get("simd_targets", {})) for s in n["schemes"] for c in s["cells"]),
                  Counter())
    text = (f"Trials per SIMD target: {simd_targets(targets)}.\n\n"
            f"f16, correct answers over {len(n['depths'])} depths x {n['trials']} trials per "
            f"context (a pass needs {pct(n['f16_pass_rate'])}):\n\n" +
            table(["task"] + [str(c) for c in n["contexts"]], rows) +
            f"\n{n['statement']}.\n")
    pairs = f16_passing(n)
    if pairs:
        rows = []
        for s in n["schemes"]:
            cells = [c for c in s["cells"] if (c["task"], c["context"]) in pairs]
            correct, trials = sum(c["correct"] for c in cells), sum(c["trials"] for c in cells)
            low, high = wilson95(correct, trials)
            rows.append([f"`{s['name']}`"] +
                        [cell_rate([c for c in cells if (c["task"], c["context"]) == pair])
                         for pair in pairs] +
                        [f"{cell_rate(cells)}, {pct(low)} - {pct(high)}"])
        text += ("\nEvery scheme where f16 passes (the last column pools those cells, with "
                 "its 95% Wilson interval):\n\n" +
                 table(["scheme"] + [f"{t} @ {c}" for t, c in pairs] + ["all, 95% interval"],
                       rows))
    return text


def pooled_by_depth(n):
    """{(scheme, context, depth): {"correct", "trials"}} over the (task,
    context) pairs f16 passes: the issue's context-by-depth grid."""
    passing = set(f16_passing(n))
    pools = {}
    for s in n["schemes"]:
        for c in s["cells"]:
            if (c["task"], c["context"]) in passing:
                pool = pools.setdefault((s["name"], c["context"], c["depth"]),
                                        {"correct": 0, "trials": 0})
                pool["correct"] += c["correct"]
                pool["trials"] += c["trials"]
    return pools


def render_needle_depth(study):
    """The issue's grid, context x depth per scheme, the tasks pooled where f16 passes."""
    if "needle" not in study:
        raise KeyError("no needle section (kvq study --niah; needle.json)")
    n = study["needle"]
    passing, pools = f16_passing(n), pooled_by_depth(n)
    contexts = [c for c in n["contexts"] if any(ctx == c for _, ctx in passing)]
    if not contexts:
        return "f16 passes no (task, context) pair, so no scheme ran.\n"

    def row(name, label, by_depth):
        return ([f"`{name}`", label] +
                [f"{p['correct']}/{p['trials']}" if p else "-" for p in by_depth] +
                [cell_rate([p for p in by_depth if p])])

    rows = []
    for s in n["schemes"]:
        for ctx in contexts:
            rows.append(row(s["name"], str(ctx),
                            [pools.get((s["name"], ctx, d)) for d in n["depths"]]))
        if len(contexts) > 1:  # each depth over the contexts
            over = [[pools[(s["name"], c, d)] for c in contexts if (s["name"], c, d) in pools]
                    for d in n["depths"]]
            rows.append(row(s["name"], "all", [
                {k: sum(p[k] for p in ps) for k in ("correct", "trials")} if ps else None
                for ps in over]))
    tasks = {ctx: sum(1 for _, c in passing if c == ctx) for ctx in contexts}
    pooled = ", ".join(f"{tasks[c]} at {c}" for c in contexts)
    return (f"Correct answers by context and depth, the tasks f16 passes pooled ({pooled}; "
            f"{n['trials']} trials a task at each depth; a scheme's \"all\" row sums each "
            f"depth over the contexts):\n\n" +
            table(["scheme", "context"] + [f"depth {d:g}" for d in n["depths"]] + ["all"], rows))


def span(values):
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def needle_coverage(n):
    """What the needle grid holds: tasks f16 can do, contexts, trials a cell."""
    f16 = next(s for s in n["schemes"] if s["name"] == "f16")
    trials = sorted({c["trials"] for s in n["schemes"] for c in s["cells"]})
    can = [t["task"] for t in n["per_task"] if t["model_can_do"]]
    pooled = sorted({p["trials"] for p in pooled_by_depth(n).values()})
    contexts = sorted({c["context"] for c in f16["cells"]})
    return (f"{len(n['tasks'])} tasks at {', '.join(str(c) for c in contexts)}; "
            f"{span(trials)} trials a (task, depth) cell"
            + (f", {span(pooled)} a (context, depth) cell pooling "
               f"the tasks f16 passes; " if pooled else "; ") +
            f"{'f16 alone' if len(n['schemes']) == 1 else str(len(n['schemes'])) + ' schemes'}; "
            f"f16 passes "
            f"{', '.join(can) if can else 'none'}")


def needle_cell(path):
    """A needle cell file's (task, context): TASK_cCONTEXT_dDEPTH.jsonl."""
    task, context = re.fullmatch(r"(.+)_c([0-9]+)_d[0-9.]+", path.stem).groups()
    return task, int(context)


def needle_cells(scheme_dir):
    """{cell file: its complete records} in one scheme's needle folder."""
    return {f: read_lines(f) for f in sorted(scheme_dir.glob("*.jsonl"))}


def needle_tally(cells):
    """Correct answers by context over a scheme's recorded needle trials, e.g.
    "correct at 1024 100/100, 2048 37/50"; `cells` maps each cell file
    (TASK_cCONTEXT_dDEPTH.jsonl) to its records."""
    by_context = {}
    for f, records in cells.items():
        tally = by_context.setdefault(needle_cell(f)[1], [0, 0])
        tally[0] += sum(1 for r in records if r.get("correct"))
        tally[1] += len(records)
    return "correct at " + ", ".join(f"{c} {k}/{n}" for c, (k, n) in sorted(by_context.items()))


MISS_KINDS = ("a number of the needle's length", "another number", "text")


def miss_kind(record):
    """What a wrong answer starts with: a number as long as the needle's values
    (" 8750111." for 8750011), another number (" 266940."), or text (" for
    the road ...", " for-329.": digits inside words are not an answer)."""
    leading = re.match(r"\s*([0-9]+)", record.get("answer", ""))
    values = record.get("values") or [""]
    if not leading:
        return MISS_KINDS[2]
    return MISS_KINDS[0] if len(leading.group(1)) == len(values[0]) else MISS_KINDS[1]


def recorded_trials(root, spellings):
    """{scheme: {(task, context): [each trial's first record]}} under a model's
    results/needle/ (a trial recorded twice counts once, first, as kvq's
    needle stage counts it)."""
    trials = {}
    for d in sorted(p for p in root.glob("*") if p.is_dir()):
        by_cell = trials.setdefault(scheme_of(d.name, spellings), {})
        for f, records in needle_cells(d).items():
            by_cell.setdefault(needle_cell(f), []).extend(first_records(records, "trial").values())
    return trials


def render_needle_recorded(study_dir, model, studies):
    """Every needle trial recorded under M/results/needle/ so far, per scheme and
    (task, context), over the depths: the schemes and contexts needle.json
    does not hold yet (it is written for the grid its command names) included,
    with a row over all contexts per scheme, and what the wrong answers hold;
    schemes are named as the model's JSONs spell them."""
    root = pathlib.Path(study_dir) / model / "results" / "needle"
    trials = recorded_trials(root, scheme_spellings(studies.get(model, {})))
    if not trials:
        raise KeyError(f"block 'needle_recorded {model}': no trials under {root}")
    known = ["single_repeat", "single_needle", "multikey_repeat", "multivalue_repeat"]
    tasks = sorted({t for cells in trials.values() for t, _ in cells},
                   key=lambda t: (known.index(t) if t in known else 9, t))

    def row(name, context, by_task):
        records = [r for task in tasks for r in by_task.get(task, [])]
        correct = sum(1 for r in records if r.get("correct"))
        kinds = Counter(miss_kind(r) for r in records if not r.get("correct"))
        return ([f"`{name}`", context] +
                [f"{sum(1 for r in by_task[task] if r.get('correct'))}/{len(by_task[task])}"
                 if task in by_task else "-" for task in tasks] +
                [f"{correct}/{len(records)} ({pct(correct / len(records))})"] +
                [kinds[k] for k in MISS_KINDS])

    rows = []
    for name in sorted(trials, key=lambda s: (s != "f16", s)):
        cells = trials[name]
        contexts = sorted({c for _, c in cells})
        for context in contexts:
            rows.append(row(name, context, {t: r for (t, c), r in cells.items() if c == context}))
        if len(contexts) > 1:
            rows.append(row(name, "all", {t: [r for (t2, _), rs in cells.items() if t2 == t
                                              for r in rs] for t, _ in cells}))
    return table(["scheme", "context"] + tasks + ["all tasks"] +
                 [f"misses: {k}" for k in MISS_KINDS], rows)
