#!/usr/bin/python3
"""Evaluate an exported model folder on the held-out test split and write its model card.

* Transformer: next-token NLL over the whole test split in non-overlapping 1024-token
  windows (every token but the first is predicted once; context restarts per window).
* Baselines on exactly the same predicted tokens and tokenizer: add-k unigram and add-k
  bigram counted on the train split, k chosen on the validation split.
* Perplexity per token = exp(NLL / tokens); per word = exp(NLL / whitespace words).
* Sample generations (greedy and sampled) from the PyTorch model.
Writes MODEL/eval.json, MODEL/loss_curve.png and MODEL/README.md.

Usage: /usr/bin/python3 tools/train/evaluate.py --model models/kvq-tiny-qwen2 \
           --corpus .deps/corpus --run /var/cache/kvq/train/run
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Tokenizer  # noqa: E402
from hf_io import load_hf_folder  # noqa: E402
import model_card  # noqa: E402

EOT = "<|endoftext|>"
PROMPTS = ["The President said that", "Call me", "It was a dark night, and", "The Congress of the United States",
           "Sherlock Holmes"]


@torch.no_grad()
def transformer_nll(model, ids, seq):
    """Sum of -log p over ids[1:]: windows of `seq` predictions, context restarts per window."""
    total = 0.0
    for s in range(0, len(ids) - 1, seq):
        x = torch.tensor(ids[s:s + seq + 1])[None]
        total += F.cross_entropy(model(x[:, :-1])[0], x[0, 1:], reduction="sum").item()
    return total


def unigram_counts(train, V):
    return np.bincount(train, minlength=V).astype(np.float64)


def unigram_nll(counts, ids, k):
    V = len(counts)
    return -np.log((counts[ids[1:]] + k) / (counts.sum() + k * V)).sum()


class Bigram:
    """Add-k bigram counted on `train`; counts for a text are gathered once, so
    scanning many k values is cheap."""

    def __init__(self, train, V):
        self.V = V
        self.pair = np.bincount(train[:-1] * V + train[1:], minlength=V * V).astype(np.int32).reshape(V, V)
        self.ctx = self.pair.sum(1).astype(np.float64)

    def gather(self, ids):
        return self.pair[ids[:-1], ids[1:]].astype(np.float64), self.ctx[ids[:-1]]

    def nll(self, gathered, k):
        c_ab, c_a = gathered
        return -np.log((c_ab + k) / (c_a + k * self.V)).sum()


def pick_k(fn, grid):
    """k with the smallest NLL on validation."""
    return min(grid, key=fn)


@torch.no_grad()
def generate(model, ids, n, greedy, gen, temperature=0.8, top_k=40):
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids[-1024:]]))[0, -1]
        if greedy:
            nxt = int(logits.argmax())
        else:
            v, i = torch.topk(logits / temperature, top_k)
            nxt = int(i[torch.multinomial(F.softmax(v, -1), 1, generator=gen)])
        ids.append(nxt)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/kvq-tiny-qwen2")
    ap.add_argument("--corpus", default=".deps/corpus")
    ap.add_argument("--run", default="", help="training folder of the stage just exported (train.log, metrics.jsonl)")
    ap.add_argument("--stage", type=int, default=0,
                    help="with --run: keep its log and metrics as training/stage<N>.* in the model folder")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--gen-tokens", type=int, default=48)
    ap.add_argument("--max-test-tokens", type=int, default=0, help="debug: evaluate only a prefix")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t0 = time.time()

    model = load_hf_folder(args.model)
    print(f"loaded {args.model}", flush=True)
    tok = Tokenizer.load(os.path.join(args.model, "tokenizer.json"))
    V = model.cfg.vocab_size
    with open(os.path.join(args.corpus, "test.txt"), encoding="utf-8") as f:
        test_text = f.read()
    test = np.array(tok.encode(test_text), dtype=np.int64)
    stored = np.fromfile(os.path.join(args.corpus, "test.bin"), dtype="<u2").astype(np.int64)
    assert np.array_equal(test, stored), "tokenizer in model folder differs from the one used for the corpus"
    if args.max_test_tokens:
        test = test[:args.max_test_tokens]
        test_text = tok.decode(test.tolist())
    print(f"test split encoded ({time.time() - t0:.0f}s)", flush=True)
    train = np.fromfile(os.path.join(args.corpus, "train.bin"), dtype="<u2").astype(np.int64)
    valid = np.fromfile(os.path.join(args.corpus, "valid.bin"), dtype="<u2").astype(np.int64)
    n_pred = len(test) - 1
    n_words = len(test_text.replace(EOT, " ").split())

    grid = [10.0 ** e for e in np.arange(-4, 0.51, 0.25)]
    uni = unigram_counts(train, V)
    ku = pick_k(lambda k: unigram_nll(uni, valid, k), grid)
    bi = Bigram(train, V)
    gv, gt = bi.gather(valid), bi.gather(test)
    kb = pick_k(lambda k: bi.nll(gv, k), grid)
    nll = {"unigram": unigram_nll(uni, test, ku), "bigram": bi.nll(gt, kb)}
    del bi
    print(f"baselines done ({time.time() - t0:.0f}s): unigram k={ku:.3g}, bigram k={kb:.3g}", flush=True)
    nll["transformer"] = transformer_nll(model, test.tolist(), args.seq)
    print(f"transformer done ({time.time() - t0:.0f}s)", flush=True)

    res = {"test_tokens_predicted": n_pred, "test_words": n_words, "tokens_per_word": n_pred / n_words,
           "unigram_k": ku, "bigram_k": kb, "window": args.seq}
    for name, v in nll.items():
        res[name] = {"nll_per_token": v / n_pred, "ppl_per_token": math.exp(v / n_pred),
                     "ppl_per_word": math.exp(v / n_words)}
    res["ratio_transformer_to_bigram_ppl"] = res["transformer"]["ppl_per_token"] / res["bigram"]["ppl_per_token"]
    for name in ("unigram", "bigram", "transformer"):
        r = res[name]
        print(f"{name:12s} PPL/token {r['ppl_per_token']:9.2f}   PPL/word {r['ppl_per_word']:9.2f}")
    print(f"transformer / bigram = {res['ratio_transformer_to_bigram_ppl']:.3f} (bar: <= 0.5)")

    gen = torch.Generator().manual_seed(0)
    samples = []
    for p in PROMPTS:
        ids = tok.encode(p)
        for greedy in (True, False):
            out = generate(model, ids, args.gen_tokens, greedy, gen)
            samples.append({"prompt": p, "mode": "greedy" if greedy else "sampled (T=0.8, top-k 40, seed 0)",
                            "text": tok.decode(out)})
            print(f"[{samples[-1]['mode']}] {samples[-1]['text']!r}")
    res["samples"] = samples
    res["eval_seconds"] = time.time() - t0
    with open(os.path.join(args.model, "eval.json"), "w") as f:
        json.dump(res, f, indent=1)
    if args.run:
        if args.stage <= 0:
            raise SystemExit("--run needs --stage N (the stage number this run is)")
        os.makedirs(os.path.join(args.model, "training"), exist_ok=True)
        for name in ("train.log", "metrics.jsonl"):
            shutil.copyfile(os.path.join(args.run, name), os.path.join(args.model, "training", f"stage{args.stage}.{name}"))
    model_card.write(args.model, args.corpus, res)
    print(f"wrote {args.model}/eval.json, README.md, loss_curve.png ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    main()
