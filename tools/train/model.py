"""Qwen2ForCausalLM in plain PyTorch 1.13, numerically matching Hugging Face's code.

Only what kvq's default model needs: no KV cache (training / reference forward),
no sliding window, no dropout.  Parameter names mirror HF so export is a rename-free
dump: model.embed_tokens, model.layers.N.self_attn.{q,k,v,o}_proj,
model.layers.N.mlp.{gate,up,down}_proj, model.layers.N.{input,post_attention}_layernorm,
model.norm; lm_head is tied to embed_tokens.
"""
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Qwen2Config:
    vocab_size: int = 8192
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_hidden_layers: int = 6
    num_attention_heads: int = 6
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype)


def rope_cos_sin(seq_len, head_dim, theta, device=None):
    """HF Qwen2 rotary tables: inv_freq[i] = theta^(-2i/d), emb = cat(freqs, freqs)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float().to(device) / head_dim))
    t = torch.arange(seq_len, dtype=torch.int64).float().to(device)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    """Pairs are (i, i + d/2): the 'rotate_half' layout HF uses for Qwen2/Llama."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    # x: [B, heads, T, d]; cos/sin: [T, d]
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kvh * self.d, bias=True)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, capture=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kvh, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kvh, self.d).transpose(1, 2)
        k_pre = k
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if capture is not None:   # [B, kv_heads, T, d] -> [B, T, kv_heads, d]
            capture.append({"k_pre_rope": k_pre.transpose(1, 2), "k": k.transpose(1, 2), "v": v.transpose(1, 2)})
        # GQA: query head j uses KV head j // rep (HF repeat_kv). The rep query heads of one KV
        # head are stacked into one [rep*T, d] matrix so K and V are read in place, not repeated.
        rep = self.h // self.kvh
        q = (q * (1.0 / math.sqrt(self.d))).reshape(B, self.kvh, rep * T, self.d)
        scores = torch.matmul(q, k.transpose(-1, -2)).view(B, self.kvh, rep, T, T)
        scores = scores.masked_fill(mask, float("-inf"))  # mask [T, T] bool, True above the diagonal
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        out = torch.matmul(probs.view(B, self.kvh, rep * T, T), v)  # [B, kv_heads, rep*T, d]
        out = out.view(B, self.h, T, self.d).transpose(1, 2).reshape(B, T, self.h * self.d)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, mask, capture=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, capture)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Qwen2Model(cfg)
        self.apply(self._init)

    def _init(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=self.cfg.initializer_range)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids, capture=None):
        """ids [B, T] -> logits [B, T, vocab].  capture: optional list receiving per-layer K/V."""
        T = ids.shape[1]
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, ids.device)
        mask = torch.ones(T, T, dtype=torch.bool, device=ids.device).triu(1)  # True = masked
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, capture)
        x = self.model.norm(x)
        return F.linear(x, self.model.embed_tokens.weight)  # tied lm_head

    def num_params(self):
        return sum(p.numel() for p in self.parameters())
