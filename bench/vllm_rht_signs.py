#!/usr/bin/env python3
"""vLLM int4_per_token_head's rotation signs, drawn by torch itself.

vLLM (vllm/v1/attention/ops/int4_per_token_head.py, _get_rht_signs) seeds a
CPU torch.Generator with 0x9E3779B9 and draws the diagonal D of its
randomized Hadamard transform as 2 * bernoulli(0.5) - 1 over a d-long
tensor. kvq re-derives the same draws from std::mt19937 (VllmRhtSigns in
src/kv/codec_vllm.cc); tests/golden/vllm_rht_signs.txt holds this script's
output and tests/kv/vllm_codec_test.cc requires kvq's signs to equal it.

Run with the venv of scripts/setup_peers.sh:
  .deps/venv-peers/bin/python bench/vllm_rht_signs.py > tests/golden/vllm_rht_signs.txt
"""
import torch

print(f"# torch {torch.__version__}: 2 * bernoulli(full(d, 0.5), Generator(cpu).manual_seed(0x9E3779B9)) - 1")
for d in (16, 32, 64, 128, 256):
    generator = torch.Generator(device="cpu")
    generator.manual_seed(0x9E3779B9)
    signs = 2.0 * torch.bernoulli(torch.full((d,), 0.5), generator=generator) - 1.0
    print(d, "".join("+" if s > 0 else "-" for s in signs.tolist()))
