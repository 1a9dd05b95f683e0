"""Byte-level BPE shared by the tokenizer trainer, the corpus encoder and evaluation.

Same scheme as GPT-2 / Qwen2: NFC-normalize, split with Qwen2's pre-tokenizer
regex, map every UTF-8 byte to a printable unicode character (bytes_to_unicode),
then apply merges by rank inside each pre-token.  Special tokens are matched
verbatim before pre-tokenization.
"""
import json
import unicodedata

import regex

# Qwen2's Split pattern, verbatim from its tokenizer.json pre_tokenizer.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRETOK = regex.compile(QWEN2_SPLIT)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable-char table (insertion order = byte ids 0..255)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE2CHAR = bytes_to_unicode()
CHAR2BYTE = {c: b for b, c in BYTE2CHAR.items()}


def pretokenize(text):
    """Pre-tokens of one text chunk without special tokens, as byte-level strings."""
    return ["".join(BYTE2CHAR[b] for b in piece.encode("utf-8")) for piece in PRETOK.findall(text)]


class Tokenizer:
    def __init__(self, vocab, merges, specials):
        self.vocab = vocab                      # byte-level string -> id
        self.id2tok = {i: t for t, i in vocab.items()}
        self.ranks = {tuple(m): r for r, m in enumerate(merges)}
        self.specials = specials                # string -> id
        for s, i in specials.items():
            self.id2tok[i] = s
        self.special_re = regex.compile("(" + "|".join(regex.escape(s) for s in specials) + ")")
        self.cache = {}

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        merges = [m.split(" ") if isinstance(m, str) else m for m in tj["model"]["merges"]]
        specials = {t["content"]: t["id"] for t in tj["added_tokens"]}
        return cls(tj["model"]["vocab"], merges, specials)

    def _bpe(self, word):
        ids = self.cache.get(word)
        if ids is not None:
            return ids
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            parts[best:best + 2] = [parts[best] + parts[best + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        text = unicodedata.normalize("NFC", text)
        out = []
        for chunk in self.special_re.split(text):
            if chunk in self.specials:
                out.append(self.specials[chunk])
            elif chunk:
                for w in pretokenize(chunk):
                    out.extend(self._bpe(w))
        return out

    def decode(self, ids):
        out, buf = [], []
        for i in ids:
            t = self.id2tok[i]
            if i in self.specials.values():
                out.append(bytes(buf).decode("utf-8", errors="replace"))
                out.append(t)
                buf = []
            else:
                buf.extend(CHAR2BYTE[c] for c in t)
        out.append(bytes(buf).decode("utf-8", errors="replace"))
        return "".join(out)
