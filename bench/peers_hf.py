#!/usr/bin/env python3
"""Hugging Face transformers' QuantizedCache (optimum-quanto backend) on the
windows llama-perplexity scored, for bench/quality_peers.sh.

The model is loaded from the same GGUF (transformers dequantizes it to f32).
Every window is fed one token at a time, so each position attends over the
cache as stored: quantized, plus QuantizedCache's f16-precision residual of up
to `residual_length` tokens (its design). With a whole-window prefill HF would
attend exactly within the prefill and quantize only on storage, which is not
what llama.cpp and kvq measure (they attend over the stored cache for every
token of a batch). Rows n_ctx/2 .. n_ctx-2 of each window are scored against
the next token, like llama-perplexity. The baseline is the same model with
its default DynamicCache, fed the same way; KL(baseline || quantized) is
computed here from the f32 log-probs of both.

Check that HF runs the same tokens and weights: its baseline log-probs are
compared with kvq's f16-cache log-probs (--kvq-base, a kvq --save-logits file)
and llama.cpp's (--llama-base) on the same windows.

Run with the venv of scripts/setup_peers.sh. Writes one JSON file.
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np


def read_llama_base(path):
    """Header, tokens and (lazily) the rows of a llama-perplexity
    --kl-divergence-base file (layout: src/engine/logits_file.h)."""
    with open(path, "rb") as f:
        magic = f.read(8)
        if magic != b"_logits_":
            sys.exit(f"{path}: not a llama-perplexity --kl-divergence-base file (magic {magic!r})")
        n_ctx, n_vocab, n_chunk = np.frombuffer(f.read(12), dtype="<i4")
    n_ctx, n_vocab, n_chunk = int(n_ctx), int(n_vocab), int(n_chunk)
    tokens = np.fromfile(path, dtype="<i4", count=n_ctx * n_chunk, offset=20).reshape(n_chunk, n_ctx)
    nv = 2 * ((n_vocab + 1) // 2) + 4
    first = n_ctx // 2
    rows = np.memmap(path, dtype="<u2", mode="r", offset=20 + 4 * n_ctx * n_chunk,
                     shape=(n_chunk, n_ctx - 1 - first, nv))
    return dict(n_ctx=n_ctx, n_vocab=n_vocab, n_chunk=n_chunk, first=first, tokens=tokens,
                rows=rows)


def llama_row_logprobs(rows, w, r, n_vocab):
    """Decoded log-probs of one stored row: scale * q + min_log_prob."""
    raw = np.asarray(rows[w, r])
    scale, min_lp = raw[:4].copy().view("<f4")
    return scale.astype(np.float64) * raw[4:4 + n_vocab].astype(np.float64) + float(min_lp)


def read_kvq_base(path):
    """A kvq --save-logits file (KVQLOGP, layout: src/engine/logits_file.h)."""
    with open(path, "rb") as f:
        magic = f.read(8)
        if magic != b"KVQLOGP\0":
            sys.exit(f"{path}: not a kvq --save-logits file (magic {magic!r})")
        version, n_vocab, n_ctx, first, n_windows, dtype = np.frombuffer(f.read(24), dtype="<u4")
    if version != 1:
        sys.exit(f"{path}: version {version}, expected 1")
    n_vocab, n_ctx, first, n_windows = int(n_vocab), int(n_ctx), int(first), int(n_windows)
    off = 32
    tokens = np.fromfile(path, dtype="<i4", count=n_ctx * n_windows, offset=off)
    tokens = tokens.reshape(n_windows, n_ctx)
    off += 4 * n_ctx * n_windows
    lp = np.float16 if dtype == 1 else np.float32
    row_t = np.dtype([("argmax", "<i4"), ("nll", "<f4"), ("lp", lp, (n_vocab,))])
    rows = np.memmap(path, dtype=row_t, mode="r", offset=off,
                     shape=(n_windows, n_ctx - 1 - first))
    return dict(n_ctx=n_ctx, n_vocab=n_vocab, first=first, n_windows=n_windows, tokens=tokens,
                rows=rows)


def renorm(lp):
    """Stored log-probs (16-bit) renormalized so they are a distribution."""
    m = lp.max()
    return lp - (m + math.log(np.exp(lp - m).sum()))


def kl(base_lp, lp):
    """KL(base || this) in nats, both log-prob vectors (float64)."""
    p = np.exp(base_lp)
    return float(np.sum(p * (base_lp - lp)))


class Stats:
    """Accumulates what llama-perplexity reports for one cache."""

    def __init__(self):
        self.nll, self.kl, self.same = [], [], []

    def add(self, nll, kl_value=None, same=None):
        self.nll.append(nll)
        if kl_value is not None:
            self.kl.append(kl_value)
            self.same.append(same)

    def summary(self):
        nll = np.array(self.nll)
        n = len(nll)
        ppl = math.exp(nll.mean())
        # llama-perplexity's error: PPL * sqrt(var(nll) / (n - 1))
        ppl_err = ppl * math.sqrt(max(nll.var(), 0.0) / max(n - 1, 1))
        out = dict(positions=n, ppl=ppl, ppl_err=ppl_err)
        if self.kl:
            k = np.array(self.kl)
            s = np.array(self.same, dtype=np.float64)
            out.update(mean_kl=float(k.mean()), mean_kl_err=float(k.std(ddof=1) / math.sqrt(len(k))),
                       p99_kl=float(np.percentile(k, 99)), max_kl=float(k.max()),
                       same_top1_pct=100.0 * float(s.mean()),
                       same_top1_err=100.0 * float(math.sqrt(s.mean() * (1 - s.mean()) / len(s))))
        return out


def make_cache(kind, config, args):
    from transformers import DynamicCache, QuantizedCache
    if kind == "dynamic":
        return DynamicCache(config=config)
    nbits = int(kind.removeprefix("quanto"))
    return QuantizedCache(backend="quanto", config=config, nbits=nbits,
                          q_group_size=args.q_group_size, residual_length=args.residual_length)


def cache_storage(cache):
    """Bytes the quantized layers hold per sequence (codes, scales, shifts as
    stored; a batch of windows divides by its size) and how many tokens they
    cover, summed over layers, read from the objects."""
    data = meta = tokens = resid = 0
    for layer in cache.layers:
        for q in (layer._quantized_keys, layer._quantized_values):
            if q is None:
                continue
            batch = q.shape[0]
            # A PackedTensor reports the unpacked shape; its _data is the
            # packed uint8 storage (2 or 4 codes per byte).
            packed = getattr(q._data, "_data", q._data)
            data += packed.numel() * packed.element_size() // batch
            meta += q._scale.numel() * q._scale.element_size() // batch
            meta += q._shift.numel() * q._shift.element_size() // batch
            tokens += q.shape[-2]
        for r in (layer.keys, layer.values):
            if r is not None and r.dim() == 4:
                resid += r.numel() * r.element_size() // r.shape[0]
    return dict(code_bytes=data, scale_shift_bytes=meta, quantized_token_layers_kv=tokens,
                residual_bytes=resid, scale_dtype=str(layer._quantized_keys._scale.dtype))


def run_windows(model, ids, first, kind, args, torch):
    """Feeds a batch of windows [batch, n_ctx] token by token (every window
    is its own sequence; a step's matrix products serve the whole batch);
    returns f32 log-probs of the scored rows [batch, n_ctx - 1 - first,
    n_vocab] and the cache at the end."""
    cache = make_cache(kind, model.config, args)
    n_ctx = ids.shape[1]
    rows = []
    with torch.inference_mode():
        for i in range(n_ctx - 1):
            out = model(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True)
            if i >= first:
                rows.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
    return torch.stack(rows, dim=1).numpy(), cache


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="model GGUF (the file llama.cpp and kvq ran)")
    ap.add_argument("--llama-base", required=True,
                    help="llama-perplexity --kl-divergence-base file: its tokens and windows are used")
    ap.add_argument("--kvq-base", help="kvq --save-logits file of an f16-cache run on the same windows")
    ap.add_argument("--windows", type=int, default=0, help="score the first N windows (0: all)")
    ap.add_argument("--caches", default="dynamic,quanto4,quanto2")
    ap.add_argument("--q-group-size", type=int, default=64)
    ap.add_argument("--residual-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1,
                    help="windows decoded together, each its own sequence (the same figures up to float rounding)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()

    import torch
    import transformers
    import optimum.quanto
    from transformers import AutoModelForCausalLM
    import gguf

    torch.set_num_threads(args.threads)
    base = read_llama_base(args.llama_base)
    n_windows = base["n_chunk"] if args.windows <= 0 else min(args.windows, base["n_chunk"])
    first, n_vocab = base["first"], base["n_vocab"]
    reader = gguf.GGUFReader(args.gguf)
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    add_bos = bool(field.parts[field.data[0]][0]) if field else False
    bos = reader.fields.get("tokenizer.ggml.bos_token_id")
    bos_id = int(bos.parts[bos.data[0]][0]) if bos else None
    del reader

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                                 gguf_file=os.path.basename(args.gguf),
                                                 dtype=torch.float32)
    model.eval()
    load_s = time.time() - t0
    if model.config.vocab_size != n_vocab:
        sys.exit(f"vocab: HF model {model.config.vocab_size}, llama base file {n_vocab}")
    kvq = read_kvq_base(args.kvq_base) if args.kvq_base else None
    if kvq is not None and (kvq["n_ctx"] != base["n_ctx"] or kvq["n_vocab"] != n_vocab):
        sys.exit("kvq base file: n_ctx or n_vocab differs from the llama base file")

    caches = args.caches.split(",")
    stats = {c: Stats() for c in caches}
    vs_kvq, vs_llama = Stats(), Stats()
    storage, seconds = {}, {c: 0.0 for c in caches}
    def write(done):
        """The result so far (rewritten after every window)."""
        result = dict(
            windows=done, n_ctx=base["n_ctx"], first_scored_row=first, add_bos=add_bos,
            q_group_size=args.q_group_size, residual_length=args.residual_length, threads=args.threads,
            batch=args.batch,
            model_dtype="float32", load_seconds=load_s, seconds=seconds,
            versions=dict(python=platform.python_version(), torch=torch.__version__,
                          transformers=transformers.__version__, optimum_quanto=optimum.quanto.__version__,
                          gguf=getattr(gguf, "__version__", "0.19.0")),
            caches={c: stats[c].summary() for c in caches}, storage=storage,
            check_vs_llama_f16=vs_llama.summary() if ref is not None else None,
            check_vs_kvq_f16=vs_kvq.summary() if (ref is not None and kvq is not None) else None,
            command=" ".join([os.path.relpath(sys.executable)] + sys.argv))
        with open(args.output, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
        return result

    def window_tokens(w):
        toks = base["tokens"][w].copy()
        if add_bos:
            toks[0] = bos_id  # as llama-perplexity feeds a window
        if kvq is not None and not np.array_equal(kvq["tokens"][w], toks):
            sys.exit(f"window {w}: kvq's tokens differ from llama.cpp's")
        return toks

    batch = max(1, args.batch)
    for w0 in range(0, n_windows, batch):
        group = list(range(w0, min(n_windows, w0 + batch)))
        toks = np.stack([window_tokens(w) for w in group])
        ids = torch.from_numpy(toks.astype(np.int64))
        lps = {}
        for c in caches:
            t = time.time()
            lps[c], cache = run_windows(model, ids, first, c, args, torch)
            seconds[c] += time.time() - t
            print(f"hf: windows {w0 + 1}-{group[-1] + 1}/{n_windows}, {c}: {time.time() - t:.0f} s",
                  flush=True)
            if c != "dynamic":
                storage[c] = cache_storage(cache)
        for b, w in enumerate(group):
            targets = toks[b][first + 1:]
            window = {c: lps[c][b].astype(np.float64) for c in caches}  # each converted once
            ref = window.get("dynamic")
            for r in range(len(targets)):
                for c in caches:
                    lp = window[c][r]
                    nll = -float(lp[targets[r]])
                    if c == "dynamic" or ref is None:
                        stats[c].add(nll)
                    else:
                        stats[c].add(nll, kl(ref[r], lp), int(lp.argmax() == ref[r].argmax()))
                if ref is not None:
                    hf_nll = -float(ref[r][targets[r]])
                    if kvq is not None:
                        klp = renorm(kvq["rows"][w, r]["lp"].astype(np.float64))
                        vs_kvq.add(hf_nll, kl(klp, ref[r]), int(klp.argmax() == ref[r].argmax()))
                    llp = renorm(llama_row_logprobs(base["rows"], w, r, n_vocab))
                    vs_llama.add(hf_nll, kl(llp, ref[r]), int(llp.argmax() == ref[r].argmax()))
        print(f"hf: windows {w0 + 1}-{group[-1] + 1}/{n_windows} done "
              f"({', '.join(f'{c} {seconds[c]:.0f}s' for c in caches)})", flush=True)
        result = write(group[-1] + 1)
    print(json.dumps(result["caches"], indent=1))


if __name__ == "__main__":
    main()
