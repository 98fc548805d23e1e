"""A causal LM of a model type liger_core has no recipe for ("liger_core_toy"), built to exercise structural
patching: it has modules that must be recognised and swapped, and look-alikes that must be left alone.

Swappable: ToyRMSNorm (Llama semantics, epsilon named ``eps``), ToyGemmaNorm (1 + w, fp32), ToyMLP (SwiGLU),
``rotate_q_k`` (HF's rotate_half RoPE under another name), the loss head (``self.loss_function``).
Look-alikes that must NOT be swapped: ToyScaledNorm (RMSNorm times 2), ToyOddMLP (act(gate) + up),
``scaled_rotary`` (GPT-J's rotate-every-two with sin doubled: not a rotation).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast


class ToyConfig(PretrainedConfig):
    model_type = "liger_core_toy"

    def __init__(
        self, vocab_size=96, hidden_size=32, intermediate_size=48, num_heads=4, num_layers=2, **kwargs
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_heads = num_heads
        self.num_layers = num_layers
        super().__init__(**kwargs)


class ToyRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class ToyGemmaNorm(ToyRMSNorm):
    def forward(self, x):
        xf = x.float()
        return (
            xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight.float())
        ).to(x.dtype)


class ToyScaledNorm(ToyRMSNorm):
    def forward(self, x):
        return 2.0 * super().forward(x)


class ToyMLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ToyOddMLP(ToyMLP):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_q_k(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def scaled_rotary(q, k, cos, sin):
    def rot(x):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)

    cos, sin = cos.unsqueeze(1), 2 * sin.unsqueeze(1)
    return q * cos + rot(q) * sin, k * cos + rot(k) * sin


class ToyAttention(nn.Module):
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def _split(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _out(self, q, k, v):
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).flatten(2))

    def forward(self, x, cos, sin):
        q, k, v = self._split(x)
        q, k = rotate_q_k(q, k, cos, sin)
        return self._out(q, k, v)


class ToyInterleavedAttention(ToyAttention):
    def forward(self, x, cos, sin):
        q, k, v = self._split(x)
        q, k = scaled_rotary(q, k, cos, sin)
        return self._out(q, k, v)


class ToyBlock(nn.Module):
    def __init__(self, config, odd: bool):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.norm1 = ToyRMSNorm(h)
        self.attn = (ToyInterleavedAttention if odd else ToyAttention)(h, config.num_heads)
        self.norm2 = ToyGemmaNorm(h) if not odd else ToyScaledNorm(h)
        self.mlp = ToyOddMLP(h, i) if odd else ToyMLP(h, i)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class ToyPreTrainedModel(PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "model"

    def _init_weights(self, module):
        pass


class ToyModel(ToyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList([ToyBlock(config, odd=i % 2 == 1) for i in range(config.num_layers)])
        self.norm = ToyRMSNorm(config.hidden_size)
        self.post_init()

    def forward(self, input_ids=None, **kwargs):
        x = self.embed(input_ids)
        head_dim = self.config.hidden_size // self.config.num_heads
        pos = torch.arange(input_ids.shape[1], dtype=torch.float32, device=x.device)
        inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=x.device) / head_dim)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), -1)[None].expand(input_ids.shape[0], -1, -1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        return (self.norm(x),)


class ToyForCausalLM(ToyPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = ToyModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def forward(self, input_ids=None, labels=None, **kwargs):
        hidden = self.model(input_ids=input_ids)[0]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)
