#!/usr/bin/python3
"""Diagonal Fisher information of the K/V activations for `kvq calibrate --fisher`.

KVQuant weights its k-means by the squared gradient of the language-model loss with
respect to each activation. This script runs the PyTorch reference model over the
same windows `kvq calibrate` uses (the text's token ids from .deps/corpus/*.bin, cut
into windows of --ctx tokens; the model adds no BOS) and writes, per layer, the squared
gradient of the summed next-token NLL with respect to the pre-RoPE K (k_proj output)
and V (v_proj output) of every token but each window's first (the f16 sink).

Output (safetensors, F32): "k.L", "v.L" [windows * (ctx - 1), kv_heads, head_dim] in
window order, and "tokens" [windows * ctx] (the ids as F32, exact below 2^24) so kvq
can check it saw the same text.

Usage: /usr/bin/python3 tools/train/kvquant_fisher.py MODEL_DIR TOKENS.bin OUT
           [--ctx 512] [--tokens 4096]
"""
import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_io import load_hf_folder, save_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("tokens_bin", help="uint16 token ids of the calibration text (train_tokenizer.py)")
    ap.add_argument("out")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_hf_folder(args.model)
    cfg = model.cfg
    ids = np.fromfile(args.tokens_bin, dtype="<u2").astype(np.int64)
    available = len(ids) // args.ctx
    if available == 0:
        sys.exit(f"{args.tokens_bin}: fewer than {args.ctx} tokens")
    windows = min(available, max(1, args.tokens // args.ctx))
    outputs = {}
    for layer_index, layer in enumerate(model.model.layers):
        for side, proj in (("k", layer.self_attn.k_proj), ("v", layer.self_attn.v_proj)):
            def hook(_module, _inputs, out, key=f"{side}.{layer_index}"):
                out.retain_grad()
                outputs[key] = out
            proj.register_forward_hook(hook)
    fisher = {f"{s}.{l}": [] for l in range(cfg.num_hidden_layers) for s in "kv"}
    for w in range(windows):
        window = torch.from_numpy(ids[w * args.ctx:(w + 1) * args.ctx]).unsqueeze(0)
        model.zero_grad(set_to_none=True)
        logits = model(window)
        loss = F.cross_entropy(logits[0, :-1], window[0, 1:], reduction="sum")
        loss.backward()
        for key, out in outputs.items():
            g = out.grad[0, 1:].reshape(args.ctx - 1, cfg.num_key_value_heads, cfg.head_dim)
            fisher[key].append((g.double() ** 2).float().numpy())
    tensors = {key: np.concatenate(parts) for key, parts in fisher.items()}
    tensors["tokens"] = ids[: windows * args.ctx].astype(np.float32)
    save_safetensors(args.out, tensors, {"format": "kvq-kvquant-fisher/1", "ctx": str(args.ctx),
                                         "windows": str(windows)})
    print(f"{args.out}: {windows} windows of {args.ctx} tokens, "
          f"{cfg.num_hidden_layers} layers x K/V squared gradients")


if __name__ == "__main__":
    main()
