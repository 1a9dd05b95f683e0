#!/usr/bin/python3
"""Export a training checkpoint as a Hugging Face Qwen2 folder + kvq golden file.

Writes OUT/{config.json, model.safetensors (f32), tokenizer.json, tokenizer_config.json,
generation_config.json} and the golden file, after checking that the folder loads back
into the same logits.  The model card (README.md, eval.json, loss curve) is written
by evaluate.py afterwards.

Usage: /usr/bin/python3 tools/train/export.py --ckpt /var/cache/kvq/train/run/ckpt.pt \
           --out models/kvq-tiny-qwen2 --golden tests/golden/kvq-tiny-qwen2.golden
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden  # noqa: E402
from bpe import Tokenizer  # noqa: E402
from hf_io import hf_config, load_hf_folder, save_safetensors  # noqa: E402
from model import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

# Fixed golden inputs: (text, number of tokens kept).  Lengths 1, 7 and 40 cover a
# single token, a short prompt and more than two 16-token KV blocks; the last one
# starts with <|endoftext|> so the special-token path is exercised too.
GOLDEN_INPUTS = [
    ("The", 1),
    ("Call me Ishmael. Some years ago, never mind how long", 7),
    ("<|endoftext|>Fellow-Citizens of the Senate and House of Representatives: In meeting you again "
     "I feel much satisfaction in being able to repeat my congratulations on the favorable prospects "
     "which continue to distinguish our public affairs.", 40),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default="/var/cache/kvq/train/run/ckpt.pt")
    ap.add_argument("--tokenizer-dir", default=".deps/corpus", help="where train_tokenizer.py wrote tokenizer*.json")
    ap.add_argument("--out", default="models/kvq-tiny-qwen2")
    ap.add_argument("--golden", default="tests/golden/kvq-tiny-qwen2.golden")
    args = ap.parse_args()
    torch.set_num_threads(2)

    state = torch.load(args.ckpt, map_location="cpu")
    cfg = Qwen2Config(**state["config"])
    model = Qwen2ForCausalLM(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    print(f"checkpoint step {state['step']}/{state['max_steps']}, {model.num_params():,} parameters")

    os.makedirs(args.out, exist_ok=True)
    tok = Tokenizer.load(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    eos = tok.specials["<|endoftext|>"]
    # state_dict names are already HF's; tied lm_head is not stored (tie_word_embeddings).
    tensors = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    save_safetensors(os.path.join(args.out, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(hf_config(cfg, eos), f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": eos, "eos_token_id": eos, "do_sample": True, "temperature": 0.8,
                   "top_k": 40, "top_p": 0.95, "max_new_tokens": 128, "transformers_version": "4.43.0"}, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(args.out, name))

    # Round trip: the folder must reproduce the in-memory model exactly.
    reloaded = load_hf_folder(args.out)
    x = torch.tensor([tok.encode("It was the best of times, it was the worst of times.")])
    with torch.no_grad():
        diff = (model(x) - reloaded(x)).abs().max().item()
    assert diff == 0.0, f"exported folder differs from checkpoint: {diff}"

    seqs = []
    for text, n in GOLDEN_INPUTS:
        ids = tok.encode(text)[:n]
        assert len(ids) == n, (text, len(ids))
        seqs.append((tok.decode(ids), ids))
    os.makedirs(os.path.dirname(args.golden) or ".", exist_ok=True)
    golden.write(args.golden, golden.compute(reloaded, seqs))

    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    print(f"wrote {args.out} ({total / 2**20:.1f} MiB) and {args.golden} "
          f"({os.path.getsize(args.golden) / 2**20:.2f} MiB); round trip OK")
    assert total <= 40 * 2**20


if __name__ == "__main__":
    main()
