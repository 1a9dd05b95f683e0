"""Generated blocks of the markdown docs, shared by the bench/*_table.py scripts.

The text between `<!-- KIND:NAME begin -->` and `<!-- KIND:NAME end -->` (or
`<!-- KIND begin -->` ... `<!-- KIND end -->` for a block without a name) is
rendered by a script from data that ships beside the doc and is never edited
by hand: `embed` writes it, `check` (a ctest) fails when it differs from what
the data gives, and `self_test` proves that `check` catches a changed figure.

A script passes `render(kind, name) -> str`, the function that makes a
block's text from its data.
"""
import glob
import os
import re
import sys
import tempfile


def markers(kind, name):
    tag = f"{kind}:{name}" if name else kind
    return f"<!-- {tag} begin -->\n", f"<!-- {tag} end -->"


def find_blocks(text, kinds):
    """Yields (kind, name, body) for every block of one of `kinds` in text."""
    pattern = (r"<!-- (" + "|".join(map(re.escape, kinds)) +
               r")(?::(\S+))? begin -->\n(.*?)<!-- \1(?::\2)? end -->")
    for m in re.finditer(pattern, text, re.S):
        yield m.group(1), m.group(2) or "", m.group(3)


def embed(tool, doc, kind, name, content):
    """Replaces the body of the block (kind, name) of doc with content."""
    text = open(doc).read()
    begin, end = markers(kind, name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        sys.exit(f"{tool}: {doc} has no {begin.strip()} ... {end} block")
    with open(doc, "w") as f:
        f.write(text[:i + len(begin)] + content + text[j:])


def check(tool, doc, kinds, render, hint, require_one=False):
    """0 when every block of `kinds` in doc equals render(kind, name), else 1.
    hint(kind, name) is the command that regenerates a stale block."""
    found = 0
    for kind, name, body in find_blocks(open(doc).read(), kinds):
        found += 1
        if body != render(kind, name):
            tag = f"{kind}:{name}" if name else kind
            print(f"{tool}: {doc}: block {tag} is stale; regenerate with\n  {hint(kind, name)}")
            return 1
    if require_one and found == 0:
        print(f"{tool}: {doc} has no {' or '.join(kinds)} blocks")
        return 1
    print(f"{tool}: {found} generated blocks of {doc} match their data")
    return 0


def self_test(tool, kind, name, render, figure):
    """check passes on a freshly embedded block and fails once the first match
    of the regex `figure` (one group: a number) is changed."""
    with tempfile.TemporaryDirectory() as tmp:
        doc = os.path.join(tmp, "doc.md")
        begin, end = markers(kind, name)
        with open(doc, "w") as f:
            f.write(f"x\n{begin}{end}\n")
        embed(tool, doc, kind, name, render(kind, name))
        if check(tool, doc, [kind], render, lambda k, n: "(the self-test changed it)") != 0:
            sys.exit(f"{tool} self-test: a freshly embedded block does not check")
        text = open(doc).read()
        m = re.search(figure, text)
        if not m:
            sys.exit(f"{tool} self-test: no figure to change")
        changed = f"{float(m.group(1)) * 1.5 + 1:.4g}"
        open(doc, "w").write(text[:m.start(1)] + changed + text[m.end(1):])
        if check(tool, doc, [kind], render, lambda k, n: "(the self-test changed it)") == 0:
            sys.exit(f"{tool} self-test: a changed figure was not caught")
    print(f"{tool} self-test: ok")
    return 0


def run_dirs(root, marker, extra=None):
    """Names of the directories under root that hold `marker` (and, when given,
    a file matching the glob `extra`), sorted: the runs a self-test picks from."""
    found = []
    for path in glob.glob(os.path.join(root, "*", marker)):
        directory = os.path.dirname(path)
        if extra is None or glob.glob(os.path.join(directory, extra)):
            found.append(os.path.basename(directory))
    return sorted(found)


def cli(tool, argv, kinds, applies, self_test_run, figure, usage):
    """The table scripts' command line (usage: the script's docstring):

      render DIR [KIND]      KIND's table of DIR (default: the first kind)
      embed DOC ROOT NAME    every kind that applies to ROOT/NAME, into DOC's
                             <!-- KIND:NAME --> blocks
      check DOC ROOT         a ctest: every block of these kinds is current
      --self-test ROOT       check catches a changed figure (regex `figure`) in
                             a block of the first run self_test_run(ROOT) names

    kinds: {kind: render(directory)}, in order; applies(kind, directory):
    whether a run directory holds that kind's data."""
    def named(root):
        return lambda kind, name: kinds[kind](os.path.join(root, name))

    script = f"bench/{tool}.py"
    if argv[:1] == ["render"] and len(argv) in (2, 3) and (len(argv) == 2 or argv[2] in kinds):
        sys.stdout.write(kinds[argv[2] if len(argv) == 3 else next(iter(kinds))](argv[1]))
    elif argv[:1] == ["embed"] and len(argv) == 4:
        directory = os.path.join(argv[2], argv[3])
        wrote = [embed(tool, argv[1], kind, argv[3], make(directory))
                 for kind, make in kinds.items() if applies(kind, directory)]
        if not wrote:
            sys.exit(f"{tool}: {directory} holds no data for {', '.join(kinds)}")
    elif argv[:1] == ["check"] and len(argv) == 3:
        return check(tool, argv[1], list(kinds), named(argv[2]),
                     lambda kind, name: f"{script} embed {argv[1]} {argv[2]} {name}",
                     require_one=True)
    elif argv[:1] == ["--self-test"] and len(argv) == 2:
        runs = self_test_run(argv[1])
        if not runs:
            sys.exit(f"{tool}: no run directories under {argv[1]}")
        first = next(iter(kinds))
        return self_test(tool, first, runs[0], named(argv[1]), figure)
    else:
        sys.exit(usage)
    return 0
