"""Hugging Face folder I/O without transformers/safetensors: hand-written safetensors,
Qwen2 config.json, and loading an exported folder back into model.Qwen2ForCausalLM."""
import json
import os
import struct

import numpy as np
import torch

from model import Qwen2Config, Qwen2ForCausalLM

_DT = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "I32": np.dtype("<i4")}
_DT_NAME = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32"}


def save_safetensors(path, tensors, metadata=None):
    """tensors: name -> numpy array.  Layout: u64 LE header size, JSON header
    (padded with spaces to a multiple of 8), then the raw little-endian data."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        b = a.tobytes()
        header[name] = {"dtype": _DT_NAME[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        out[name] = np.frombuffer(data[s:e], dtype=_DT[info["dtype"]]).reshape(info["shape"])
    return out


def hf_config(cfg, eos_id):
    """config.json with the exact field names of HF's Qwen2Config."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": cfg.hidden_size,
        "initializer_range": cfg.initializer_range,
        "intermediate_size": cfg.intermediate_size,
        "max_position_embeddings": cfg.max_position_embeddings,
        "max_window_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_key_value_heads": cfg.num_key_value_heads,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": cfg.rope_theta,
        "sliding_window": cfg.max_position_embeddings,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.43.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": cfg.vocab_size,
    }


def config_from_hf(d):
    return Qwen2Config(vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
                       intermediate_size=d["intermediate_size"], num_hidden_layers=d["num_hidden_layers"],
                       num_attention_heads=d["num_attention_heads"], num_key_value_heads=d["num_key_value_heads"],
                       max_position_embeddings=d["max_position_embeddings"], rope_theta=d["rope_theta"],
                       rms_norm_eps=d["rms_norm_eps"])


def load_hf_folder(folder):
    """Build the PyTorch model from an exported folder (config.json + model.safetensors)."""
    with open(os.path.join(folder, "config.json")) as f:
        cfg = config_from_hf(json.load(f))
    model = Qwen2ForCausalLM(cfg)
    tensors = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_safetensors(os.path.join(folder, "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.eval()
    return model
