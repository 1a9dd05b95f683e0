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
