"""Helpers the findings renderers share (scripts/render_findings.py): number
formats, Markdown tables, the Wilson interval kvq's GSM8K stage reports, and
the mapping between scheme names and kvq's results file stems."""
import json
import math
import re


def fmt(x, digits=3):
    """Three significant digits, plain notation down to 1e-3, else scientific."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if x == 0:
        return "0"
    if math.isinf(x):  # a head whose median channel is 0: the ratio has no bound
        return "inf" if x > 0 else "-inf"
    if abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.{max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))}f}"


def pct(x):
    return f"{100 * x:.1f}%"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def wilson95(correct, trials):
    """The 95% Wilson score interval of a rate (the one kvq's GSM8K stage reports)."""
    if trials == 0:
        return 0.0, 1.0
    z, p = 1.959963984540054, correct / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials**2))
    return max(0.0, centre - half), min(1.0, centre + half)


def simd_targets(counts):
    """{"AVX2": 40, "AVX3_ZEN4": 10} -> "AVX2 40, AVX3_ZEN4 10" ("" = not recorded)."""
    return ", ".join(f"{t or 'not recorded'} {n}" for t, n in sorted(counts.items()))


def result_file_stem(name):
    """kvq's ResultFileStem (src/study/study_resume.cc): the scheme's name with
    characters other than [A-Za-z0-9._-] as "_", cut to 64, then "-" and the
    FNV-1a hash of the whole name, so "int4+rot" -> "int4_rot-2093aa04"."""
    stem, h = "", 2166136261
    for byte in name.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
        c = chr(byte)
        stem += c if c.isascii() and (c.isalnum() or c in "._-") else "_"
    return f"{stem[:64]}-{h:08x}"


def json_strings(value):
    """Every string (keys included) in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from json_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from json_strings(v)


def scheme_spellings(study):
    """{results file stem: the scheme's name as written} for every string in a
    model's loaded study (load_studies: study.json with its stages' JSONs); a
    stem's hash is of the exact name, so a match is that name."""
    return {result_file_stem(n): n for n in set(json_strings(study))}


def scheme_of(stem, spellings):
    """A results file's scheme: its name as the model's JSONs write it, or, for a
    scheme no JSON names yet, the stem without ResultFileStem's 8-digit hash."""
    return spellings.get(stem) or re.sub(r"-[0-9a-f]{8}$", "", stem)


def read_lines(path):
    """The complete JSON lines of a results file (a cut-short last line is not one)."""
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def first_records(records, key):
    """{record[key]: the first record with it}: a trial or problem recorded twice
    (a resumed run) counts once, first, as kvq's stages count it."""
    first = {}
    for r in records:
        first.setdefault(r.get(key), r)
    return first
