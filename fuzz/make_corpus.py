#!/usr/bin/env python3
"""Writes the small valid seed files for kvq's GGUF, safetensors and
config.json fuzz targets into fuzz/corpus/<target>/.

Written independently of kvq's own writers (only the Python standard
library), so the seeds also cross-check kvq's reader against the format
documentation. Every file stays under 10 KB. Re-run after a format change:
    python3 fuzz/make_corpus.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

# --- GGUF -------------------------------------------------------------------
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
GGML = {"F32": (0, 4), "F16": (1, 2), "Q8_0": (8, None), "BF16": (30, 2)}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf_value(t, v):
    if t == STR:
        return gguf_str(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gguf_value(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors, align=32):
    """kvs: [(key, type, value)]; tensors: [(name, dtype, shape outermost-first, bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gguf_str(k) + struct.pack("<I", t) + gguf_value(t, v)
    offset, data = 0, b""
    for name, dtype, shape, raw in tensors:
        out += gguf_str(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<q", d) for d in reversed(shape))
        out += struct.pack("<IQ", GGML[dtype][0], offset)
        padded = raw + b"\0" * (-len(raw) % align)
        data += padded
        offset += len(padded)
    out += b"\0" * (-len(out) % align)
    return out + data


def floats(n, fmt="<f", scale=0.02):
    return b"".join(struct.pack(fmt, scale * ((i * 37 % 17) - 8)) for i in range(n))


def halfs(n):
    return b"".join(struct.pack("<e", 0.02 * ((i * 37 % 17) - 8)) for i in range(n))


def q8_0(blocks):
    return b"".join(struct.pack("<e", 0.01) + bytes((i * 7) % 256 for i in range(32))
                    for _ in range(blocks))


def micro_model(arch, hidden=16, heads=2, kv=1, head_dim=8, ffn=16, vocab=8, layers=1,
                bias=False, tied=True):
    p = arch + "."
    kvs = [("general.architecture", STR, arch),
           (p + "context_length", U32, 64), (p + "embedding_length", U32, hidden),
           (p + "block_count", U32, layers), (p + "feed_forward_length", U32, ffn),
           (p + "attention.head_count", U32, heads), (p + "attention.head_count_kv", U32, kv),
           (p + "rope.freq_base", F32, 10000.0),
           (p + "attention.layer_norm_rms_epsilon", F32, 1e-5),
           (p + "rope.dimension_count", U32, head_dim),
           ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "gpt-2"),
           ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "c", "ab", "bc", "abc", " ", "<s>"])),
           ("tokenizer.ggml.token_type", ARR, (I32, [1] * 7 + [3])),
           ("tokenizer.ggml.merges", ARR, (STR, ["a b", "b c", "ab c"])),
           ("tokenizer.ggml.eos_token_id", U32, 7)]
    t = [("token_embd.weight", "F16", [vocab, hidden], halfs(vocab * hidden))]
    for i in range(layers):
        b = f"blk.{i}."
        t += [(b + "attn_norm.weight", "F32", [hidden], floats(hidden)),
              (b + "attn_q.weight", "F16", [heads * head_dim, hidden], halfs(heads * head_dim * hidden)),
              (b + "attn_k.weight", "F16", [kv * head_dim, hidden], halfs(kv * head_dim * hidden)),
              (b + "attn_v.weight", "F16", [kv * head_dim, hidden], halfs(kv * head_dim * hidden))]
        if bias:
            t += [(b + "attn_q.bias", "F32", [heads * head_dim], floats(heads * head_dim)),
                  (b + "attn_k.bias", "F32", [kv * head_dim], floats(kv * head_dim)),
                  (b + "attn_v.bias", "F32", [kv * head_dim], floats(kv * head_dim))]
        t += [(b + "attn_output.weight", "F16", [hidden, heads * head_dim], halfs(hidden * heads * head_dim)),
              (b + "ffn_norm.weight", "F32", [hidden], floats(hidden)),
              (b + "ffn_gate.weight", "F16", [ffn, hidden], halfs(ffn * hidden)),
              (b + "ffn_up.weight", "F16", [ffn, hidden], halfs(ffn * hidden)),
              (b + "ffn_down.weight", "F16", [hidden, ffn], halfs(hidden * ffn))]
    t.append(("output_norm.weight", "F32", [hidden], floats(hidden)))
    if not tied:
        t.append(("output.weight", "F16", [vocab, hidden], halfs(vocab * hidden)))
    return gguf(kvs, t)


def every_type():
    kvs = [("u8", U8, 250), ("i8", I8, -100), ("u16", U16, 65000), ("i16", I16, -32000),
           ("u32", U32, 4000000000), ("i32", I32, -123456), ("f32", F32, 1.5), ("b", BOOL, 1),
           ("s", STR, "hello \u2713"), ("u64", U64, 1 << 60), ("i64", I64, -(1 << 60)),
           ("f64", F64, 3.25), ("general.alignment", U32, 64),
           ("arr", ARR, (I32, [1, -2, 3])), ("strs", ARR, (STR, ["x", "", "yz"])),
           ("nested", ARR, (ARR, [(U8, [1, 2]), (STR, ["q"]), (ARR, [(F64, [])])]))]
    t = [("a.f32", "F32", [2, 3], floats(6)), ("b.f16", "F16", [5], halfs(5)),
         ("c.bf16", "BF16", [3, 1], struct.pack("<3H", 0x3F80, 0xBF80, 0x4000)),
         ("d.q8", "Q8_0", [2, 32], q8_0(2))]
    return gguf(kvs, t, align=64)


# --- safetensors ---------------------------------------------------------------
ST = {"F32": ("<f", 4), "F16": ("<e", 2), "BF16": (None, 2)}


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-(8 + len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data


def hf_micro():
    hidden, ffn, vocab = 8, 8, 4
    t = [("model.embed_tokens.weight", "F32", [vocab, hidden], floats(vocab * hidden))]
    b = "model.layers.0."
    for n, shape in [("input_layernorm.weight", [hidden]), ("self_attn.q_proj.weight", [8, hidden]),
                     ("self_attn.q_proj.bias", [8]), ("self_attn.k_proj.weight", [4, hidden]),
                     ("self_attn.k_proj.bias", [4]), ("self_attn.v_proj.weight", [4, hidden]),
                     ("self_attn.v_proj.bias", [4]), ("self_attn.o_proj.weight", [hidden, 8]),
                     ("post_attention_layernorm.weight", [hidden]),
                     ("mlp.gate_proj.weight", [ffn, hidden]), ("mlp.up_proj.weight", [ffn, hidden]),
                     ("mlp.down_proj.weight", [hidden, ffn])]:
        size = 1
        for d in shape:
            size *= d
        t.append((b + n, "BF16", shape, b"\x80\x3f" * size))
    t.append(("model.norm.weight", "F16", [hidden], halfs(hidden)))
    return safetensors(t, {"format": "pt"})


QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 896,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "use_sliding_window": False, "vocab_size": 151936}
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                                            "low_freq_factor": 1.0,
                                            "original_max_position_embeddings": 8192,
                                            "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256}


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 10 * 1024, (name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    write("gguf", "every_type.gguf", every_type())
    write("gguf", "micro_llama.gguf", micro_model("llama"))
    write("gguf", "micro_qwen2.gguf", micro_model("qwen2", bias=True, tied=False))
    write("gguf", "empty.gguf", gguf([], []))
    write("safetensors", "dtypes.safetensors",
          safetensors([("a", "F32", [2, 3], floats(6)), ("b", "F16", [4], halfs(4)),
                       ("c", "BF16", [2], b"\x80\x3f\x00\x40"), ("s", "F32", [], floats(1))]))
    write("safetensors", "hf_micro.safetensors", hf_micro())
    write("safetensors", "empty.safetensors", safetensors([]))
    write("hf_config", "qwen2.5-0.5b.json", json.dumps(QWEN_CONFIG, indent=1))
    write("hf_config", "llama-3.2-1b.json", json.dumps(LLAMA_CONFIG, indent=1))


if __name__ == "__main__":
    main()
