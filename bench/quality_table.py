#!/usr/bin/env python3
"""Issue 19's quality tables (KL, top-1, PPL vs f16 per scheme) from the raw
`kvq perplexity` logs that ship under docs/quality/MODEL/ (rerunnable on partial
results: a row whose log has no KL is listed as not measured).

  bench/quality_table.py types DIR        the --types list `kvq plan` needs for DIR's rows
  bench/quality_table.py render DIR       the markdown of DIR (NAME.log, NAME.cmd, plan.json)
  bench/quality_table.py embed DOC ROOT NAME
                                          DOC's <!-- quality:NAME begin/end --> := render ROOT/NAME
  bench/quality_table.py check DOC ROOT   every quality block of DOC equals render ROOT/NAME
  bench/quality_table.py --self-test ROOT check fails on a stale block

Each row's cache flags are read from its NAME.cmd (the command as run), so the
bytes looked up in plan.json (`kvq plan --json`, exact bytes) are those of the
cache that ran. tests/CMakeLists.txt's quality_doc_test runs `check`.
"""
import json
import os
import re
import sys

import doc_blocks

# (name, group, what). group "paper": a published setting reproduced by its
# authors' numbers; "kvq": kvq's own schemes, the candidates for "kvq's best at
# the same or fewer bytes"; "ablation": rows that isolate one ingredient.
ROWS = [
    ("oscar2", "paper", "OSCAR INT2 recipe: calibrated rotation (qqt_sst), clip 96/92 %, first 64 + newest 256 tokens f16"),
    ("oscar2_ktk", "ablation", "oscar2 with the ktk_vtv rotation (rows' own covariance)"),
    ("quarot2", "paper", "QuaRot-INT2 (OSCAR's baseline): Hadamard, same clip, sinks and window"),
    ("oscar2_codes", "ablation", "oscar-int2 codes alone (qqt_sst), no f16 rows"),
    ("oscar2_codes_ktk", "ablation", "oscar-int2 codes alone (ktk_vtv), no f16 rows"),
    ("quarot2_codes", "ablation", "quarot-int2 codes alone, no f16 rows"),
    ("int2g64_codes", "kvq", "int2-g64-asym: the same INT2 grid without rotation or clipping"),
    ("oscar2_codes_s1", "ablation", "oscar-int2 codes + first token f16"),
    ("oscar2_codes_a1", "ablation", "oscar-int2 codes + 1 detected sink f16"),
    ("kivi2", "paper", "KIVI-2: K per channel, V per token, g32, newest 128 f16"),
    ("kivi2_s1", "ablation", "KIVI-2 + first 1 token f16"),
    ("kivi2_a1", "ablation", "KIVI-2 + 1 detected sink f16"),
    ("kivi2_s4", "ablation", "KIVI-2 + first 4 tokens f16"),
    ("kivi2_a4", "ablation", "KIVI-2 + 4 detected sinks f16"),
    ("kivi2_s16", "ablation", "KIVI-2 + first 16 tokens f16"),
    ("kivi2_a16", "ablation", "KIVI-2 + 16 detected sinks f16"),
    ("int2g64_s1", "kvq", "int2-g64-asym + first 1 token f16"),
    ("int2g64_a1", "kvq", "int2-g64-asym + 1 detected sink f16"),
    ("int2g64_s4", "kvq", "int2-g64-asym + first 4 tokens f16"),
    ("int2g64_a4", "kvq", "int2-g64-asym + 4 detected sinks f16"),
    ("int2g64_s16", "kvq", "int2-g64-asym + first 16 tokens f16"),
    ("int2g64_a16", "kvq", "int2-g64-asym + 16 detected sinks f16"),
    ("kvquant2", "kvq", "KVQuant-2 (kvq's calibration, train.txt)"),
    ("hf-quanto-int2", "paper", "transformers QuantizedCache quanto nbits 2 (g64, residual 128)"),
    ("turboquant2.5", "paper", "TurboQuant paper's 2.5-bit setting"),
    ("qjl_k1v4", "paper", "QJL: 1-bit sign-sketch keys + norm, per-token int4 values"),
    ("turboquant_3bit_nc", "paper", "vLLM turboquant_3bit_nc"),
    ("kvquant3", "kvq", "KVQuant-3"),
    ("turboquant3.5", "paper", "TurboQuant paper's 3.5-bit setting"),
    ("turboquant_k3v4_nc", "paper", "vLLM turboquant_k3v4_nc"),
    ("turboquant_4bit_nc", "paper", "vLLM turboquant_4bit_nc"),
    ("hf-quanto-int4", "paper", "transformers QuantizedCache quanto defaults (nbits 4, g64, residual 128)"),
    ("int4_per_token_head", "paper", "vLLM int4_per_token_head"),
    ("q4_0", "kvq", "llama.cpp q4_0 with its Hadamard rotation"),
    ("kvquant4", "kvq", "KVQuant-4"),
    ("turboquant_k8v4", "paper", "vLLM turboquant_k8v4 (fp8 keys, 4-bit values)"),
    ("fp8_per_token_head", "paper", "vLLM fp8_per_token_head"),
    ("int8_per_token_head", "paper", "vLLM int8_per_token_head"),
    ("int8", "kvq", "kvq int8 (per token, g32)"),
    ("q4_0_norot", "paper", "llama.cpp q4_0 without its rotation (LLAMA_ATTN_ROT_DISABLE=1 in llama.cpp)"),
    ("q4_1", "paper", "llama.cpp q4_1 (rotated)"),
    ("iq4_nl", "paper", "llama.cpp iq4_nl (rotated)"),
    ("q5_0", "paper", "llama.cpp q5_0 (rotated)"),
    ("q5_1", "paper", "llama.cpp q5_1 (rotated)"),
    ("q8_0", "paper", "llama.cpp q8_0 (rotated)"),
    ("fp8_e4m3-t1", "paper", "vLLM fp8 (e4m3) without checkpoint scales (1.0)"),
    ("fp8_e4m3-tcal", "paper", "vLLM fp8 (e4m3) with calibrated per-layer scales (qqt_sst file)"),
]


def cache_type(cmd):
    """The `kvq plan --types` spelling of the cache a command ran."""
    m = re.search(r"--kv-cache-dtype (\S+)", cmd)
    if m:
        return m.group(1)
    k = re.search(r"--cache-type-k (\S+)", cmd)
    v = re.search(r"--cache-type-v (\S+)", cmd)
    return f"{k.group(1)}/{v.group(1)}" if k and v else None


def parse_log(path):
    text = open(path).read()
    out = {}
    m = re.search(r"PPL\(this\)\s+([\d.]+) \+/- ([\d.]+)", text) or \
        re.search(r"^PPL:\s+([\d.]+) \+/- ([\d.]+)", text, re.M)
    if m:
        out["ppl"], out["ppl_err"] = m.group(1), m.group(2)
    m = re.search(r"PPL\(base\)\s+([\d.]+)", text)
    if m:
        out["ppl_base"] = m.group(1)
    m = re.search(r"nats, (\d+) positions", text)
    if m:
        out["positions"] = m.group(1)
    m = re.search(r"mean KLD\s+(\S+) \+/- (\S+)", text)
    if m:
        out["kl"], out["kl_err"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"same top-1\s+([\d.]+) \+/- ([\d.]+)", text)
    if m:
        out["top1"], out["top1_err"] = m.group(1), m.group(2)
    return out


def row_data(d):
    plan = json.load(open(os.path.join(d, "plan.json")))
    by_type = {t["type"]: t for t in plan["types"]}
    values = 2 * plan["model"]["layers"] * plan["model"]["kv_heads"] * plan["model"]["head_dim"]
    rows = []
    for name, group, what in ROWS:
        log, cmd = os.path.join(d, name + ".log"), os.path.join(d, name + ".cmd")
        if not (os.path.exists(cmd) and os.path.exists(log)):
            continue
        command = open(cmd).read().strip()
        t = by_type.get(cache_type(command))
        r = dict(name=name, group=group, what=what, cmd=command, **parse_log(log))
        if t:
            r["bpt"] = t["exact_bytes_per_token"]
            r["bits"] = r["bpt"] * 8 / values
            r["at512"] = t["bytes_at"]["512"]["exact"] / 512
        rows.append(r)
    return plan, rows


def fmt_kl(r):
    return f"{r['kl']:.4g} ± {r['kl_err']:.2g}" if "kl" in r else "(not measured)"


def render(d):
    plan, rows = row_data(d)
    f16 = parse_log(os.path.join(d, "f16.log"))
    model = os.path.basename(plan["model"]["name"])
    lines = [f"model: {model}; f16 PPL {f16.get('ppl', '?')} ± {f16.get('ppl_err', '?')}; "
             f"commands in `docs/quality/{os.path.basename(os.path.normpath(d))}/NAME.cmd`, logs in NAME.log", "",
             "| row | kind | what | bits/value | blocks B/token | B/token at 512 | PPL (f16 on the same windows) | scored tokens | mean KL vs f16 | same top-1 % |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        bytes_ = (f"{r['bits']:.3f} | {r['bpt']:.0f} | {r['at512']:.0f}" if "bpt" in r
                  else "? | ? | ?")
        lines.append(f"| {r['name']} | {r['group']} | {r['what']} | {bytes_} | {r.get('ppl', '-')} "
                     f"({r.get('ppl_base', '-')}) | {r.get('positions', '-')} | {fmt_kl(r)} | "
                     f"{r.get('top1', '-')} |")
    # Each published setting against the best kvq scheme (lowest KL) whose
    # blocks take the same or fewer bytes per token.
    ours = [r for r in rows if r["group"] == "kvq" and "kl" in r and "bpt" in r]
    lines += ["", "| published setting | B/token | mean KL | kvq's best at <= bytes | B/token | mean KL | KL ratio (published / kvq) |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for p in rows:
        if p["group"] != "paper" or "kl" not in p or "bpt" not in p:
            continue
        fit = [r for r in ours if r["bpt"] <= p["bpt"]]
        if not fit:
            lines.append(f"| {p['name']} | {p['bpt']:.0f} | {p['kl']:.4g} | (no kvq row this small) | | | |")
            continue
        b = min(fit, key=lambda r: r["kl"])
        lines.append(f"| {p['name']} | {p['bpt']:.0f} | {p['kl']:.4g} | {b['name']} | {b['bpt']:.0f} | "
                     f"{b['kl']:.4g} | {p['kl'] / b['kl']:.2f} |")
    return "\n".join(lines) + "\n"


def types(d):
    out = []
    for name, _, _ in ROWS:
        cmd = os.path.join(d, name + ".cmd")
        if os.path.exists(cmd):
            t = cache_type(open(cmd).read())
            if t and t not in out:
                out.append(t)
    return ",".join(out)


def render_named(root):
    return lambda kind, name: render(os.path.join(root, name))


def embed(doc, root, name):
    doc_blocks.embed("quality_table", doc, "quality", name, render(os.path.join(root, name)))


def check(doc, root):
    return doc_blocks.check("quality_table", doc, ["quality"], render_named(root),
                            lambda kind, name: f"bench/quality_table.py embed {doc} {root} {name}",
                            require_one=True)


def self_test(root):
    """check passes on a freshly embedded block and fails once a KL figure changes."""
    runs = [d for d in sorted(os.listdir(root)) if os.path.exists(os.path.join(root, d, "plan.json"))
            and re.search(r"\| \d+\.\d+ ± ", render(os.path.join(root, d)))]
    if not runs:
        sys.exit(f"quality_table: no run with a KL row under {root}")
    return doc_blocks.self_test("quality_table", "quality", runs[0], render_named(root),
                                r"\| (\d+\.\d+) ± ")


def main(argv):
    if argv[:1] == ["render"]:
        sys.stdout.write(render(argv[1]))
    elif argv[:1] == ["types"]:
        print(types(argv[1]))
    elif argv[:1] == ["embed"]:
        embed(argv[1], argv[2], argv[3])
    elif argv[:1] == ["check"]:
        return check(argv[1], argv[2])
    elif argv[:1] == ["--self-test"]:
        return self_test(argv[1])
    else:
        sys.exit(__doc__)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
