#!/usr/bin/python3
"""KVQGOLD1: PyTorch reference outputs for kvq's forward-pass test.  Writer + reader.

File layout (all integers little-endian; format documented in tools/train/README.md):
    char[8]  magic "KVQGOLD1"
    u32      version (1)
    u32      n_records
    n_records times:
        u32      name_len;  u8 name[name_len] (UTF-8, no terminator)
        u32      dtype      (0 = f32, 1 = i32, 2 = u8)
        u32      ndim;      u32 shape[ndim]
        data     prod(shape) elements of dtype, row-major (C order)

Usage as a self-check: /usr/bin/python3 tools/train/golden.py FILE [MODEL_DIR]
  prints the records; with MODEL_DIR, recomputes everything with the PyTorch model
  loaded from the exported folder and reports the max abs difference.
"""
import json
import os
import struct
import sys

import numpy as np

MAGIC, VERSION = b"KVQGOLD1", 1
DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<i4"), 2: np.dtype("u1")}
CODES = {np.dtype("<f4"): 0, np.dtype("<i4"): 1, np.dtype("u1"): 2}


def write(path, records):
    """records: list of (name, numpy array); arrays are cast to f32/i32/u8 little-endian."""
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<II", VERSION, len(records)))
        for name, a in records:
            a = np.asarray(a)
            if a.dtype.kind == "f":
                a = a.astype("<f4")
            elif a.dtype == np.uint8:
                a = a.astype("u1")
            else:
                a = a.astype("<i4")
            nb = name.encode("utf-8")
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", CODES[a.dtype], a.ndim) + struct.pack(f"<{a.ndim}I", *a.shape))
            f.write(np.ascontiguousarray(a).tobytes())


def read(path):
    """-> dict name -> numpy array (in file order)."""
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:8] == MAGIC, "bad magic"
    version, n = struct.unpack_from("<II", buf, 8)
    assert version == VERSION, f"unsupported version {version}"
    pos, out = 16, {}
    for _ in range(n):
        (ln,) = struct.unpack_from("<I", buf, pos)
        name = buf[pos + 4: pos + 4 + ln].decode("utf-8")
        pos += 4 + ln
        code, ndim = struct.unpack_from("<II", buf, pos)
        pos += 8
        shape = struct.unpack_from(f"<{ndim}I", buf, pos)
        pos += 4 * ndim
        dt = DTYPES[code]
        count = int(np.prod(shape)) if ndim else 1
        out[name] = np.frombuffer(buf, dtype=dt, count=count, offset=pos).reshape(shape)
        pos += count * dt.itemsize
    assert pos == len(buf), "trailing bytes"
    return out


def compute(model, sequences):
    """Reference records for each token sequence: tokens, logits, per-layer K/V."""
    import torch
    recs = [("meta", np.frombuffer(json.dumps({
        "format": "KVQGOLD1", "n_sequences": len(sequences), "n_layers": model.cfg.num_hidden_layers,
        "num_key_value_heads": model.cfg.num_key_value_heads, "head_dim": model.cfg.head_dim,
        "vocab_size": model.cfg.vocab_size, "dtype": "f32",
        "note": "k_pre_rope/k/v shape [tokens, kv_heads, head_dim]; k is after RoPE"}).encode(), dtype=np.uint8))]
    with torch.no_grad():
        for s, (text, ids) in enumerate(sequences):
            cap = []
            logits = model(torch.tensor([ids]), capture=cap)[0]
            recs.append((f"seq{s}.text", np.frombuffer(text.encode("utf-8"), dtype=np.uint8)))
            recs.append((f"seq{s}.tokens", np.array(ids, dtype=np.int32)))
            recs.append((f"seq{s}.logits", logits.numpy()))
            for layer, c in enumerate(cap):
                for key in ("k_pre_rope", "k", "v"):
                    recs.append((f"seq{s}.layer{layer}.{key}", c[key][0].numpy()))
    return recs


def main():
    g = read(sys.argv[1])
    for name, a in g.items():
        print(f"{name:28s} {str(a.dtype):8s} {list(a.shape)}")
    if len(sys.argv) > 2:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import torch
        from hf_io import load_hf_folder
        torch.set_num_threads(2)
        model = load_hf_folder(sys.argv[2])
        n = json.loads(bytes(g["meta"]))["n_sequences"]
        seqs = [(bytes(g[f"seq{s}.text"]).decode(), g[f"seq{s}.tokens"].tolist()) for s in range(n)]
        worst = 0.0
        for name, a in compute(model, seqs):
            worst = max(worst, float(np.abs(a.astype(np.float64) - g[name].astype(np.float64)).max()))
        print(f"self-check: max abs diff vs recomputation from {sys.argv[2]}: {worst:.3g}")
        assert worst < 1e-4


if __name__ == "__main__":
    main()
