#!/usr/bin/env python3
"""Fails when a source file includes a header of a layer it may not use.

kvq's layers (docs/ARCHITECTURE.md) depend one way:
    base -> {io, ops} -> kv -> model -> engine -> eval -> study -> tools
                                          engine -> server -> tools
(server and eval/study are siblings: the server links only the runtime)
Every target sees src/ on its include path, so the compiler alone would not
notice kv including model/...; this check (a ctest, part of `make test`)
reads every `#include "layer/..."` under src/ and tests/<layer>/ and
rejects an include of a layer that is not below (io and ops are siblings:
neither may include the other).
Usage: check_layering.py REPO_ROOT | --self-test
"""
import pathlib
import re
import sys

ALLOWED = {
    "base": set(),
    "io": {"base"},
    "ops": {"base"},
    "kv": {"base", "io", "ops"},
    "model": {"base", "io", "ops", "kv"},
    "engine": {"base", "io", "ops", "kv", "model"},
    "eval": {"base", "io", "ops", "kv", "model", "engine"},
    "study": {"base", "io", "ops", "kv", "model", "engine", "eval"},
    "server": {"base", "io", "ops", "kv", "model", "engine"},
    "tools": {"base", "io", "ops", "kv", "model", "engine", "eval", "study", "server"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([a-z_]+)/[^"]+"', re.M)


def self_test():
    """The check must pass a clean tree and fail on kv including model/ or server study/."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        kv = pathlib.Path(tmp) / "src" / "kv"
        kv.mkdir(parents=True)
        (kv / "ok.cc").write_text('#include "ops/rope.h"\n#include "kv/codec.h"\n')
        if check(pathlib.Path(tmp)):
            print("self-test: a clean tree was rejected")
            return 1
        (kv / "bad.cc").write_text('#include "model/transformer.h"\n')
        if not check(pathlib.Path(tmp)):
            print("self-test: kv including model/ was not caught")
            return 1
        (kv / "bad.cc").unlink()
        server = pathlib.Path(tmp) / "src" / "server"
        server.mkdir()
        (server / "bad.cc").write_text('#include "study/study.h"\n')
        if not check(pathlib.Path(tmp)):
            print("self-test: server including study/ was not caught")
            return 1
    print("self-test: ok")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    return 1 if check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")) else 0


def check(root):
    """Prints violations; returns True when there are any (or no sources)."""
    errors = []
    checked = 0
    for top in ("src", "tests"):
        for layer in ALLOWED:
            folder = root / top / layer
            if not folder.is_dir():
                continue
            for path in sorted(folder.rglob("*")):
                if path.suffix not in (".h", ".cc", ".inc"):
                    continue
                checked += 1
                text = path.read_text(encoding="utf-8", errors="replace")
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target not in ALLOWED or target == layer:
                        continue
                    if target not in ALLOWED[layer]:
                        line = text.count("\n", 0, m.start()) + 1
                        errors.append(f"{path.relative_to(root)}:{line}: {layer} includes "
                                      f"{target}/ (a layer {layer} may not use)")
    for e in errors:
        print(e)
    if checked == 0:
        print("check_layering: no sources found under", root)
        return True
    print(f"check_layering: {checked} files, {len(errors)} violations")
    return bool(errors)


if __name__ == "__main__":
    sys.exit(main())
