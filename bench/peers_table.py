#!/usr/bin/env python3
"""bench/quality_peers.sh's bookkeeping (standard library only).

  peers_table.py collect --out DIR ...   logs + plans + hf.json -> DIR/peers.json
  peers_table.py render DIR/peers.json   -> the markdown table on stdout
  peers_table.py embed DOC NAME PEERS_MD -> DOC's <!-- peers:NAME --> block := PEERS_MD

`render` is a pure function of peers.json, so tests/tools/peers_doc_test.sh can
check that a shipped peers.md is what its peers.json renders to.
"""
import argparse
import datetime
import json
import os
import re
import sys

import doc_blocks

# ggml's block layouts (ggml-common.h): bytes per block of 32 values, scales
# (and mins) included. llama.cpp's Hadamard rotation is a constant matrix and
# adds nothing per token. Checked against the K/V MiB the log prints.
GGML_BLOCK = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32), "q4_1": (20, 32),
              "q5_0": (22, 32), "q5_1": (24, 32), "iq4_nl": (18, 32)}
LLAMA_TYPES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"]


def grab(pattern, text, what, path, conv=float):
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit(f"peers_table: {path}: no {what} (pattern {pattern!r})")
    return conv(m.group(1))


def llama_row(path, type_, rotate, shape):
    text = open(path).read()
    row = dict(engine="llama.cpp", cache=f"{type_}" + (" + Hadamard" if rotate else " (no rotation)"))
    if type_ != "f16":
        row["ppl"] = grab(r"^Mean PPL\(Q\)\s*:\s*([\d.]+)", text, "PPL(Q)", path)
        row["ppl_err"] = grab(r"^Mean PPL\(Q\)\s*:\s*[\d.]+\s*±\s*([\d.]+)", text, "PPL error", path)
        row["mean_kl"] = grab(r"^Mean\s+KLD:\s*([-\d.e]+)", text, "mean KLD", path)
        row["mean_kl_err"] = grab(r"^Mean\s+KLD:\s*[-\d.e]+\s*±\s*([-\d.e]+)", text, "KLD error", path)
        row["p99_kl"] = grab(r"^99\.0%\s+KLD:\s*([-\d.e]+)", text, "99% KLD", path)
        row["same_top1_pct"] = grab(r"^Same top p:\s*([\d.]+)", text, "same top p", path)
        row["windows"] = grab(r"kl_divergence: computing over (\d+) chunks", text, "chunks", path, int)
    else:
        row["ppl"] = grab(r"Final estimate: PPL = ([\d.]+)", text, "PPL", path)
        row["ppl_err"] = grab(r"Final estimate: PPL = [\d.]+ \+/- ([\d.]+)", text, "PPL error", path)
        row["windows"] = grab(r"calculating perplexity over (\d+) chunks", text, "chunks", path, int)
    # What the log says the cache was: the type of K and V and the rotation.
    m = re.search(r"K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB", text)
    cells = grab(r"llama_kv_cache: size = .*?\(\s*(\d+) cells", text, "KV cells", path, int)
    rot_k = grab(r"attn_rot_k = (\d)", text, "attn_rot_k", path, int)
    rot_v = grab(r"attn_rot_v = (\d)", text, "attn_rot_v", path, int)
    if not m or m.group(1) != type_ or m.group(3) != type_:
        sys.exit(f"peers_table: {path}: the log does not show K and V of type {type_}")
    if (rot_k, rot_v) != ((1, 1) if rotate else (0, 0)):
        sys.exit(f"peers_table: {path}: attn_rot_k/v = {rot_k}/{rot_v}, expected rotation {rotate}")
    if "flash_attn            = enabled" not in text:
        sys.exit(f"peers_table: {path}: flash attention is not enabled")
    nb, nv = GGML_BLOCK[type_]
    values = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"]
    bpt = values // 2 * nb / nv * 2
    logged = (float(m.group(2)) + float(m.group(4))) * 2**20 / cells
    if abs(logged - bpt) > 0.01 * bpt:  # the log rounds MiB to 2 decimals
        sys.exit(f"peers_table: {path}: log says {logged:.0f} B/token, block layout {bpt:.0f}")
    row.update(bits_per_value=8 * nb / nv, bytes_per_token=bpt, bytes_per_token_ctx=bpt,
               log_check=dict(attn_rot_k=rot_k, attn_rot_v=rot_v, type_k=type_, type_v=type_,
                              logged_bytes_per_token=round(logged, 1), flash_attn=True))
    return row


def schedule(row):
    """How the row's windows were fed: "token" (one token a forward pass:
    transformers, and kvq's NAME_b1 rows) or "prefill" (512 tokens a pass)."""
    if row["engine"] == "transformers" or row["id"].endswith("_b1"):
        return "token"
    return "prefill"


def kvq_row(path, plan_path, name, shape):
    text = open(path).read()
    cache = name.replace("_rot", " + --kv-rotate")
    if name.endswith("_b1"):
        cache = cache[:-3] + ", token by token (-b 1)"
    row = dict(engine="kvq", cache=cache)
    row["ppl"] = grab(r"^PPL:\s+([\d.]+)", text, "PPL", path)
    row["ppl_err"] = grab(r"^PPL:\s+[\d.]+ \+/- ([\d.]+)", text, "PPL error", path)
    row["windows"] = grab(r"^windows:\s+(\d+)", text, "windows", path, int)
    if "mean KLD" in text:
        row["mean_kl"] = grab(r"mean KLD\s+([-\d.e+]+)", text, "mean KLD", path)
        row["mean_kl_err"] = grab(r"mean KLD\s+[-\d.e+]+ \+/- ([-\d.e+]+)", text, "KLD error", path)
        row["p99_kl"] = grab(r"99% KLD\s+([-\d.e+]+)", text, "99% KLD", path)
        row["same_top1_pct"] = grab(r"same top-1\s+([\d.]+)", text, "same top-1", path)
    plan = json.load(open(plan_path))
    t = plan["types"][0]
    values = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"]
    row.update(bits_per_value=8 * t["exact_bytes_per_token"] / values,
               bytes_per_token=t["exact_bytes_per_token"],
               bytes_per_token_ctx=plan["plan"]["kv_bytes"] / plan["plan"]["context"],
               plan=dict(k_type=plan["plan"]["k_type"], v_type=plan["plan"]["v_type"],
                         rotate=plan["plan"]["rotate"],
                         staging_bytes_per_sequence=t["staging_bytes_per_sequence"],
                         side_bytes=t["side_bytes"]))
    return row


def hf_rows(hf, shape):
    values = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"]
    rows = []
    for name in ["dynamic"] + sorted(k for k in hf["caches"] if k != "dynamic"):
        if name not in hf["caches"]:
            continue
        c = hf["caches"][name]
        row = dict(engine="transformers", id="hf_" + name, windows=hf["windows"], ppl=c["ppl"],
                   ppl_err=c["ppl_err"])
        if name == "dynamic":
            row.update(cache="DynamicCache (f32)", bits_per_value=32.0, bytes_per_token=values * 4.0,
                       bytes_per_token_ctx=values * 4.0)
        else:
            s = hf["storage"][name]
            nbits = int(name.removeprefix("quanto"))
            # Per quantized token and layer, K or V: codes + scale + shift as
            # stored; the run's model is f32, so scale/shift are f32. A 16-bit
            # model (HF's usual) stores them in 16 bits: halve that part.
            per_tok = shape["kv_heads"] * shape["head_dim"]
            code_bits = 8 * s["code_bytes"] / (s["quantized_token_layers_kv"] * per_tok)
            meta_bits = 8 * s["scale_shift_bytes"] / (s["quantized_token_layers_kv"] * per_tok)
            bits16 = code_bits + meta_bits / 2
            resid = hf["residual_length"] * values * 2.0 / hf["n_ctx"]
            row.update(cache=f"QuantizedCache quanto int{nbits}, g{hf['q_group_size']}, "
                             f"residual {hf['residual_length']}",
                       bits_per_value=bits16, bytes_per_token=bits16 * values / 8,
                       bytes_per_token_ctx=bits16 * values / 8 + resid,
                       mean_kl=c["mean_kl"], mean_kl_err=c["mean_kl_err"], p99_kl=c["p99_kl"],
                       same_top1_pct=c["same_top1_pct"],
                       storage=dict(code_bits_per_value=code_bits,
                                    scale_shift_bits_per_value_as_run=meta_bits,
                                    scale_dtype_as_run=s["scale_dtype"]))
        rows.append(row)
    return rows


def collect(a):
    out = a.out
    logs, work = os.path.join(out, "logs"), os.path.join(out, "work")
    cmds = {}
    for line in open(os.path.join(logs, "commands.tsv")):
        name, cmd = line.rstrip("\n").split("\t", 1)
        cmds[name] = cmd
    plan = json.load(open(os.path.join(work, "plan_f16.json")))
    m = plan["model"]
    shape = dict(layers=m["layers"], kv_heads=m["kv_heads"], head_dim=m["head_dim"])
    rows = []
    r = llama_row(os.path.join(logs, "llama_f16.log"), "f16", False, shape)
    r.update(cache="f16 (baseline)", command=cmds["llama_f16"], id="llama_f16")
    rows.append(r)
    for t in LLAMA_TYPES:
        for rot in (True, False):
            name = f"llama_{t}_{'rot' if rot else 'norot'}"
            r = llama_row(os.path.join(logs, name + ".log"), t, rot, shape)
            r.update(command=cmds[name], id=name)
            rows.append(r)
    kvq_names = [n[4:] for n in cmds if n.startswith("kvq_") and n != "kvq_calibrate"]
    for n in kvq_names:
        r = kvq_row(os.path.join(logs, f"kvq_{n}.log"), os.path.join(work, f"plan_{n}.json"), n, shape)
        r.update(command=cmds[f"kvq_{n}"], id=f"kvq_{n}")
        if n == "f16":
            r["cache"] = "f16 (baseline)"
            # kvq's f16 run is also scored against llama.cpp's f16 run
            r["cross_check_vs_llama_f16"] = {k: r.pop(k) for k in
                                             ("mean_kl", "mean_kl_err", "p99_kl", "same_top1_pct")
                                             if k in r}
        rows.append(r)
    hf = None
    hf_path = os.path.join(work, "hf.json")
    if os.path.exists(hf_path):
        # Its own record of the command: hf.json is rewritten after every
        # window, so a run stopped early still says what it covered.
        hf = json.load(open(hf_path))
        for r in hf_rows(hf, shape):
            r["command"] = hf["command"]
            rows.append(r)
    calib = cmds.get("kvq_calibrate")
    doc = dict(
        peers_version=1, model=os.path.basename(a.model), text=a.text, chunks=a.chunks, n_ctx=512,
        threads=a.threads, root=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        shape=shape, values_per_token=2 * shape["layers"] * shape["kv_heads"] *
        shape["head_dim"], date=datetime.date.today().isoformat(), llama_bin=a.llama_bin,
        kvq_calibrate_command=calib, rows=rows,
        hf=None if hf is None else {k: hf[k] for k in ("windows", "versions", "model_dtype", "seconds",
                                                        "check_vs_llama_f16", "check_vs_kvq_f16",
                                                        "q_group_size", "residual_length")})
    with open(os.path.join(out, "peers.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def fmt_kl(v):
    return "—" if v is None else f"{v:.4g}" if abs(v) >= 1e-3 else f"{v:.2e}"


def verdicts(rows):
    """For each peer row: kvq's lowest-KL scheme among those with no more
    bytes/token (both the stored blocks and the memory at the measured
    context) and a schedule no kinder than the peer's, and whether it beats
    the peer. A prefilled peer (llama.cpp) is compared with kvq's prefilled
    rows only; a peer fed token by token (transformers) with every kvq row,
    since a prefill quantizes the window's tokens before any of them attends
    (it never attends less quantized data than token-by-token feeding)."""
    kvq = [r for r in rows if r["engine"] == "kvq" and "mean_kl" in r]
    out = []
    for p in rows:
        if p["engine"] == "kvq" or "mean_kl" not in p:
            continue
        fit = [k for k in kvq if k["bytes_per_token"] <= p["bytes_per_token"] and
               k["bytes_per_token_ctx"] <= p["bytes_per_token_ctx"] and
               (schedule(p) == "token" or schedule(k) == "prefill")]
        best = min(fit, key=lambda k: k["mean_kl"]) if fit else None
        out.append((p, best, best is not None and best["mean_kl"] < p["mean_kl"]))
    return out


def render(path):
    d = json.load(open(path))
    rows = d["rows"]

    def short(cmd):  # paths as run from the repository root
        cmd = cmd.replace(d["llama_bin"] + "/", "$LLAMA_BIN/")
        return cmd.replace(d["root"] + "/", "")

    lines = [f"# KV caches of three engines on {d['model']}", "",
             f"Text `{d['text']}`, windows of {d['n_ctx']} tokens (second half scored, as "
             f"llama-perplexity does), {d['threads']} threads, {d['date']}. Generated by "
             f"`bench/quality_peers.sh` from `peers.json` (`bench/peers_table.py render`); "
             f"logs in `logs/`. Commands as run from the repository root; `$LLAMA_BIN` = "
             f"`{d['llama_bin']}`.", "",
             "Each engine is scored against **its own f16-cache run** on the same token ids "
             "(KL(baseline ‖ this) in nats, mean and 99th percentile over scored positions; "
             "same top-1 = argmax agrees with that baseline). So a row measures what the "
             "engine's cache quantization costs; the engines' f16 runs differ from one another "
             "by the cross-checks below.", "",
             "- **bits/value**: stored bytes per token × 8 / values per token "
             f"(2 × {d['shape']['layers']} layers × {d['shape']['kv_heads']} KV heads × "
             f"{d['shape']['head_dim']} = {d['values_per_token']}), scales, zero-points, "
             "outlier slots and low-rank factors included. llama.cpp: ggml's block layout "
             "(checked against the K/V MiB its log prints); kvq: `kvq plan` "
             "(`exact_bytes_per_token`); transformers: the bytes of its quanto tensors "
             "(codes, scale, shift) read after the run, scale and shift counted at 16 bits "
             "as a 16-bit model stores them (this run's model is f32, so they were f32; "
             "see `storage` in peers.json).",
             "- **B/token**: the same, per token. **B/token @512**: all KV memory at the "
             "measured 512-token context divided by 512, f16 windows included (kvq's "
             "residual/ring/sink tokens and side data from `kvq plan`; transformers' "
             f"{d['hf']['residual_length'] if d['hf'] else 128}-token residual, counted at 16 "
             "bits and full length).",
             "- llama.cpp runs with `-fa on` (quantized V needs flash attention), the baseline "
             "too; every log was checked for the K/V type, `attn_rot_k/v` (1 with llama.cpp's "
             "default Hadamard rotation, 0 with `LLAMA_ATTN_ROT_DISABLE=1`) and flash attention.",
             "- transformers feeds every window one token at a time, so each position attends "
             "over the quantized cache (prefill would attend exactly and only quantize on "
             "storage); its baseline is DynamicCache fed the same way. kvq's rows marked "
             "*token by token (-b 1)* are fed the same way on the same windows: with an f16 "
             "window of the newest tokens (quanto's residual, KIVI's) each token then attends "
             "its neighbours unquantized, where a 512-token prefill quantizes them first.",
             "- llama.cpp's CPU flash attention converts q to the dot-product type of a "
             "quantized K (q8_0 for its types; ggml-cpu `ops.cpp`, `q_to_vec_dot`) and "
             "accumulates V·softmax in f16 when V is f16; kvq dequantizes K and V and keeps q "
             "and the sums in f32. So the same stored blocks (kvq's copies of llama.cpp's "
             "types, bit-exact, below llama.cpp's rows) lose less in kvq.", ""]
    lines += ["| engine | cache | bits/value | B/token | B/token @512 | windows | PPL | mean KL | "
              "p99 KL | same top-1 % | command |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        kl = fmt_kl(r.get("mean_kl"))
        if "mean_kl_err" in r:
            kl += f" ± {fmt_kl(r['mean_kl_err'])}"
        top1 = f"{r['same_top1_pct']:.2f}" if "same_top1_pct" in r else "—"
        lines.append(f"| {r['engine']} | {r['cache']} | {r['bits_per_value']:.3f} | "
                     f"{r['bytes_per_token']:.0f} | {r['bytes_per_token_ctx']:.0f} | "
                     f"{r['windows']} | {r['ppl']:.4f} ± {r['ppl_err']:.4f} | {kl} | "
                     f"{fmt_kl(r.get('p99_kl'))} | {top1} | `{short(r['command'])}` |")
    fewer = sorted({r["windows"] for r in rows if r["windows"] != d["chunks"]})
    if fewer:
        names = sorted({r["engine"] for r in rows if r["windows"] != d["chunks"]})
        lines += ["", f"Windows differ: {', '.join(names)} rows cover the first "
                  f"{' / '.join(map(str, fewer))} of the {d['chunks']} windows the other rows use "
                  "(token-by-token decoding is slow), so their KL is noisier and not measured "
                  "on the same positions; compare their order of magnitude, not the last digit."]
    hf_cmd = next((r["command"] for r in rows if r["engine"] == "transformers"), "")
    asked = re.search(r"--windows (\d+)", hf_cmd)
    if d["hf"] and asked and 0 < d["hf"]["windows"] < int(asked.group(1)):
        lines += ["", f"The transformers run was stopped after {d['hf']['windows']} of the "
                  f"{asked.group(1)} windows its command asks for (hf.json is rewritten after "
                  "every window, so its rows are the windows that completed)."]
    lines += ["", "**Cross-checks between the engines' f16 runs.**", ""]
    kf = next((r for r in rows if r["id"] == "kvq_f16"), None)
    if kf and "cross_check_vs_llama_f16" in kf:
        c = kf["cross_check_vs_llama_f16"]
        lines.append(f"- kvq f16 vs llama.cpp f16 (same windows): mean KL {fmt_kl(c['mean_kl'])}, "
                     f"p99 {fmt_kl(c['p99_kl'])}, same top-1 {c['same_top1_pct']:.2f} %.")
    if d["hf"]:
        for key, who in (("check_vs_llama_f16", "llama.cpp"), ("check_vs_kvq_f16", "kvq")):
            c = d["hf"].get(key)
            if c:
                # A KL of proper distributions is >= 0; a mean this close to 0 is
                # the level of the stored log-probs' rounding summed over a vocabulary
                # of 50K-150K tokens (the exponentials of either side sum to 1 only to
                # about that), which can carry either sign.
                tiny = (" (within 1e-4 nats of 0, the rounding level of the stored log-probs "
                        "over the vocabulary, hence the sign: the two runs agree)"
                        ) if abs(c["mean_kl"]) < 1e-4 else ""
                lines.append(f"- transformers f32 (weights dequantized from the GGUF) vs {who} f16, "
                             f"{d['hf']['windows']} window(s): mean KL {fmt_kl(c['mean_kl'])}{tiny}, "
                             f"p99 {fmt_kl(c['p99_kl'])}, same top-1 {c['same_top1_pct']:.2f} %, "
                             f"PPL {c['ppl']:.4f}.")
        v = d["hf"]["versions"]
        lines.append(f"- transformers {v['transformers']}, optimum-quanto {v['optimum_quanto']}, "
                     f"torch {v['torch']} (CPU), Python {v['python']}.")
    if d.get("kvq_calibrate_command"):
        lines.append(f"- kvq's KVQuant rows use a calibration from other text: "
                     f"`{short(d['kvq_calibrate_command'])}`.")
    lines += ["", "**Does kvq beat every peer at no more bytes/token?**", "",
              "For each peer row, kvq's lowest-KL scheme among those whose B/token and "
              "B/token @512 are both no larger than the peer's, fed no more kindly: a "
              "llama.cpp row (512-token prefill) against kvq's prefilled rows; a transformers "
              "row (token by token) against all of kvq's, a prefill never attending less "
              "quantized data.", "",
              "| peer | peer B/token (@512) | peer mean KL | best kvq at ≤ bytes | its B/token (@512) | "
              "its mean KL | kvq lower KL? |", "| --- | ---: | ---: | --- | ---: | ---: | --- |"]
    misses = []
    for p, best, wins in verdicts(rows):
        name = f"{p['engine']} {p['cache']}"
        if best is None:
            lines.append(f"| {name} | {p['bytes_per_token']:.0f} ({p['bytes_per_token_ctx']:.0f}) | "
                         f"{fmt_kl(p['mean_kl'])} | none fits | — | — | **no** |")
            misses.append(f"{name}: no kvq scheme fits in its bytes")
            continue
        lines.append(f"| {name} | {p['bytes_per_token']:.0f} ({p['bytes_per_token_ctx']:.0f}) | "
                     f"{fmt_kl(p['mean_kl'])} | {best['cache']} | {best['bytes_per_token']:.0f} "
                     f"({best['bytes_per_token_ctx']:.0f}) | {fmt_kl(best['mean_kl'])} | "
                     f"{'yes' if wins else '**no**'} |")
        if not wins:
            misses.append(f"{name} (mean KL {fmt_kl(p['mean_kl'])} at {p['bytes_per_token']:.0f} "
                          f"B/token): kvq's best at no more bytes is {best['cache']} with "
                          f"{fmt_kl(best['mean_kl'])}")
    lines.append("")
    if misses:
        lines.append("**Where kvq does not beat the peer** (KL vs each engine's own f16 run):")
        lines.append("")
        lines += [f"- {m}" for m in misses]
    else:
        lines.append("kvq's best scheme has a lower mean KL than every peer row at no more bytes/token.")
    return "\n".join(lines) + "\n"


def embed(doc, name, md):
    """Replaces the block between <!-- peers:NAME begin/end --> in doc with md."""
    doc_blocks.embed("peers_table", doc, "peers", name, open(md).read())


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    for opt in ("--out", "--model", "--text", "--llama-bin"):
        c.add_argument(opt, required=True)
    c.add_argument("--chunks", type=int, required=True)
    c.add_argument("--threads", type=int, required=True)
    r = sub.add_parser("render")
    r.add_argument("json")
    e = sub.add_parser("embed", help="copy a peers.md into a doc between its markers")
    for opt in ("doc", "name", "md"):
        e.add_argument(opt)
    a = ap.parse_args()
    if a.cmd == "collect":
        collect(a)
    elif a.cmd == "embed":
        embed(a.doc, a.name, a.md)
    else:
        sys.stdout.write(render(a.json))


if __name__ == "__main__":
    main()
