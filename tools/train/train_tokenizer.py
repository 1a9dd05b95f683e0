#!/usr/bin/python3
"""Train kvq's byte-level BPE tokenizer on the train split and encode all splits.

Writes OUT/tokenizer.json + OUT/tokenizer_config.json (Hugging Face / Qwen2
layout) and OUT/{train,valid,test}.bin (uint16 token ids, little-endian).
Vocabulary: 256 byte tokens + merges + 3 special tokens = --vocab (8192).

Training is the classic algorithm made fast: count pre-tokens once (a word ->
frequency dict), then keep pair counts and a pair -> words index up to date
incrementally after each merge; the best pair comes from a lazy max-heap.

Usage: /usr/bin/python3 tools/train/train_tokenizer.py [--corpus .deps/corpus] [--vocab 8192]
"""
import argparse
import collections
import heapq
import json
import os
import sys
import time
import unicodedata

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import BYTE2CHAR, QWEN2_SPLIT, SPECIALS, Tokenizer, pretokenize  # noqa: E402

EOT = SPECIALS[0]

# Qwen2-Instruct's ChatML template (verbatim from Qwen2's tokenizer_config.json).
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def count_words(text):
    counts = collections.Counter()
    for doc in text.split(EOT):
        counts.update(pretokenize(unicodedata.normalize("NFC", doc)))
    return counts


def train_bpe(word_counts, n_merges):
    """Return the merge list [(a, b), ...] in rank order."""
    words = [list(w) for w in word_counts]          # symbols as strings
    freqs = list(word_counts.values())
    pair_count = collections.defaultdict(int)
    pair_words = collections.defaultdict(set)
    for wi, (w, f) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            pair_count[p] += f
            pair_words[p].add(wi)
    # Max-heap on (count, then lexicographically smallest pair) with lazy deletion.
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc:
            continue                                  # stale entry
        if -negc < 2:
            break
        merges.append(pair)
        a, b = pair
        new = a + b
        touched = set()
        for wi in list(pair_words[pair]):
            w, f = words[wi], freqs[wi]
            for p in zip(w, w[1:]):                   # remove this word's old pairs
                pair_count[p] -= f
                touched.add(p)
            i, out = 0, []
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            for p in zip(w, w[1:]):
                pair_words[p].discard(wi)
            words[wi] = out
            for p in zip(out, out[1:]):               # add the new pairs
                pair_count[p] += f
                pair_words[p].add(wi)
                touched.add(p)
        del pair_count[pair], pair_words[pair]
        for p in touched:
            if p in pair_count:
                if pair_count[p] > 0:
                    heapq.heappush(heap, (-pair_count[p], p))
                else:
                    del pair_count[p]
        if len(merges) % 1000 == 0:
            print(f"  {len(merges)} merges, last {new!r}", flush=True)
    return merges


def tokenizer_json(vocab, merges, specials):
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for s, i in specials.items()],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def tokenizer_config(specials, max_len):
    return {
        "add_bos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for s, i in specials.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": EOT, "pad_token": EOT, "unk_token": None,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False, "errors": "replace",
        "model_max_length": max_len, "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=".deps/corpus")
    ap.add_argument("--out", default=None, help="default: CORPUS")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--max-len", type=int, default=1024, help="model_max_length in tokenizer_config.json")
    args = ap.parse_args()
    out = args.out or args.corpus
    os.makedirs(out, exist_ok=True)

    t0 = time.time()
    with open(os.path.join(args.corpus, "train.txt"), encoding="utf-8") as f:
        train_text = f.read()
    counts = count_words(train_text)
    print(f"{len(counts):,} distinct pre-tokens, {sum(counts.values()):,} total ({time.time() - t0:.1f}s)")
    n_merges = args.vocab - 256 - len(SPECIALS)
    merges = train_bpe(counts, n_merges)
    print(f"{len(merges)} merges in {time.time() - t0:.1f}s")

    vocab = {c: i for i, c in enumerate(BYTE2CHAR.values())}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = {s: len(vocab) + k for k, s in enumerate(SPECIALS)}
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab, merges, specials), f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(specials, args.max_len), f, ensure_ascii=False, indent=1)

    # Encode every split with the reference encoder (re-loaded from the JSON written
    # above, so the file itself is what gets tested) and check the round trip.
    tok = Tokenizer.load(os.path.join(out, "tokenizer.json"))
    for part in ("train", "valid", "test"):
        with open(os.path.join(args.corpus, part + ".txt"), encoding="utf-8") as f:
            text = f.read()
        ids = tok.encode(text)
        assert tok.decode(ids) == unicodedata.normalize("NFC", text), f"round trip failed on {part}"
        np.asarray(ids, dtype="<u2").tofile(os.path.join(out, part + ".bin"))
        print(f"{part:5s}: {len(ids):10,d} tokens, {len(text.split()):9,d} words, "
              f"{len(ids) / max(1, len(text.split())):.3f} tokens/word, round trip OK")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
