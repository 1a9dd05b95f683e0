#!/usr/bin/env python3
"""Op-by-op bisect of llama.cpp on a Llama/Qwen2 GGUF (a reference check;
kvq never runs Python).

  harness dump MODEL.gguf DUMP.bin TOKEN...     (tools/llamacpp/harness.cc)
  /work/venv/bin/python tools/llamacpp/compare_intermediates.py MODEL.gguf DUMP.bin

Each op of each layer gets llama.cpp's own input (from the dump) and is
recomputed in f64 from the weights as gguf-py decodes them; the line shows the
relative error ||llama.cpp - ref|| / ||ref|| of its output. Matrix products
show two figures: against the exact product, and against the product with
the activations rounded as ggml-cpu rounds them for block weight types
(q8_0 / q8_1 blocks of 32, f16 scale; q8_1 also stores d * sum(q) in f16).
An op whose error is far above f32 rounding (~1e-7) in both columns is one
where llama.cpp computes something else; an error that vanishes in the second
column is ggml's activation rounding. (On SmolLM2 Q4_1 every product matches
the second column to ~3e-7 and differs from the first by 0.4-2.5%.)
"""
import sys

import gguf
import numpy as np
from gguf.quants import dequantize

Q8_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # x86 vec_dot types q8_0 / q8_1


def read_dump(path):
    """name -> list of arrays (a name can occur more than once in a graph)."""
    b = open(path, "rb").read()
    if b[:8] != b"KVQDUMP1":
        sys.exit(f"{path}: not a harness dump")
    n = int(np.frombuffer(b[8:12], np.uint32)[0])
    at, out = 12, {}
    for _ in range(n):
        ln = int(np.frombuffer(b[at:at + 4], np.uint32)[0])
        name = b[at + 4:at + 4 + ln].decode()
        at += 4 + ln
        ne = np.frombuffer(b[at:at + 32], np.int64).tolist()
        at += 32
        count = int(np.prod(ne))
        a = np.frombuffer(b[at:at + 4 * count], np.float32).reshape(tuple(reversed(ne)))
        at += 4 * count
        out.setdefault(name, []).append(a.reshape(-1, ne[0]).astype(np.float64))
    return out


class Model:
    def __init__(self, path):
        self.r = gguf.GGUFReader(path)
        self.t = {t.name: t for t in self.r.tensors}
        arch = bytes(self.r.fields["general.architecture"].parts[-1]).decode()
        self.eps = float(self.r.fields[arch + ".attention.layer_norm_rms_epsilon"].parts[-1][0])
        self.n_layer = int(self.r.fields[arch + ".block_count"].parts[-1][0])
        self.cache = {}

    def weight(self, name):
        if name not in self.cache:
            t = self.t[name]
            shape = [int(x) for x in reversed(t.shape)]
            self.cache[name] = dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float64)
        return self.cache[name]

    def rms(self, x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * self.weight(name)

    def matmul(self, x, name):
        return x @ self.weight(name).T

    def matmul_q8(self, x, name):
        """The product with x rounded as ggml-cpu's quantize_row_q8_0/q8_1."""
        t = self.t[name]
        kind = t.tensor_type.name
        if kind not in Q8_TYPES:
            return None
        blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
        amax = np.abs(blocks).max(-1, keepdims=True)
        d = amax / np.float32(127)
        inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
        q = np.round(blocks * inv)  # ggml rounds to nearest even (_mm*_round_ps)
        d16 = d.astype(np.float16).astype(np.float64)
        xq = (q * d16).reshape(x.shape)
        y = xq @ self.weight(name).T
        if kind in ("Q4_1", "Q5_1"):  # the min term uses s = d * sum(q), stored in f16
            s16 = (d * q.sum(-1, keepdims=True)).astype(np.float16).astype(np.float64)
            dev = (s16 - (q * d16).sum(-1, keepdims=True))[..., 0]  # [tokens, blocks]
            block_bytes = 20 if kind == "Q4_1" else 24
            raw = np.asarray(t.data).reshape(self.weight(name).shape[0], -1, block_bytes)
            mins = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
            y += dev @ mins.T
        return y


def rel(a, b):
    return float(np.sqrt(((a - b) ** 2).sum() / max((b ** 2).sum(), 1e-300)))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    m = Model(sys.argv[1])
    d = read_dump(sys.argv[2])

    def get(name, i=0):
        return d[name][i]

    def product(label, out, x, weight):
        q8 = m.matmul_q8(x, weight)
        q8_text = f"/{rel(out, q8):.1e}" if q8 is not None else ""
        return f"{label}={rel(out, m.matmul(x, weight)):.1e}{q8_text}"

    print("layer: op=rel. error vs the exact op[/vs the op with ggml's q8 activations]")
    for l in range(m.n_layer):
        p = f"blk.{l}."
        x = get("embd") if l == 0 else get(f"l_out-{l - 1}")
        an = get(f"attn_norm-{l}")
        cols = [f"attn_norm={rel(an, m.rms(x, p + 'attn_norm.weight')):.1e}"]
        for name, w in (("Qcur", "attn_q"), ("Kcur", "attn_k"), ("Vcur", "attn_v")):
            cols.append(product(name, get(f"{name}-{l}"), an, p + w + ".weight"))
        cols.append(product("attn_out", get(f"attn_out-{l}"), get(f"kqv_out-{l}"),
                            p + "attn_output.weight"))
        fi = get(f"ffn_inp-{l}")
        fn = get(f"ffn_norm-{l}")
        cols.append(f"ffn_norm={rel(fn, m.rms(fi, p + 'ffn_norm.weight')):.1e}")
        gate, up = get(f"ffn_gate-{l}"), get(f"ffn_up-{l}")
        cols.append(product("gate", gate, fn, p + "ffn_gate.weight"))
        cols.append(product("up", up, fn, p + "ffn_up.weight"))
        sw = get(f"ffn_swiglu-{l}")
        cols.append(f"swiglu={rel(sw, gate / (1 + np.exp(-gate)) * up):.1e}")
        cols.append(product("down", get(f"ffn_out-{l}"), sw, p + "ffn_down.weight"))
        print(f"{l:2d}: " + " ".join(cols))
    if "result_norm" in d:
        rn = get("result_norm")
        last = get(f"l_out-{m.n_layer - 1}")
        head = "output.weight" if "output.weight" in m.t else "token_embd.weight"
        print(f"result_norm={rel(rn, m.rms(last, 'output_norm.weight')):.1e} "
              + product("result_output", get("result_output"), rn, head))


if __name__ == "__main__":
    main()
