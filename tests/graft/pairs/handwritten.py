"""Hand-written layouts people copy: a gpt-fast Llama and a GPT-NeoX with separate q, k, v.

nanoGPT and Meta's reference Llama live in :mod:`tests.models`; these two complete the set.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.models import _rotate_halves, _rotate_pairs


class GptFastAttention(nn.Module):
    """gpt-fast's attention: one fused ``wqkv`` of [Q; K; V] (K and V have fewer heads).

    ``halves``: rotary on each head's two halves (transformers' order) under gpt-fast's names.
    """

    def __init__(self, dim: int, n_head: int, n_local_heads: int, *,
                 halves: bool = False) -> None:
        super().__init__()
        self.rotate = _rotate_halves if halves else _rotate_pairs
        self.n_head, self.n_local_heads = n_head, n_local_heads
        self.head_dim = dim // n_head
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_local_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        kv = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv, kv], dim=-1)
        q = self.rotate(q.view(b, t, self.n_head, self.head_dim), cos, sin)
        k = self.rotate(k.view(b, t, self.n_local_heads, self.head_dim), cos, sin)
        v = v.view(b, t, self.n_local_heads, self.head_dim)
        rep = self.n_head // self.n_local_heads
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class GptFastFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GptFastBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, n_local_heads: int, hidden: int,
                 eps: float, *, halves: bool = False) -> None:
        super().__init__()
        self.attention = GptFastAttention(dim, n_head, n_local_heads, halves=halves)
        self.feed_forward = GptFastFeedForward(dim, hidden)
        self.ffn_norm = nn.RMSNorm(dim, eps=eps)
        self.attention_norm = nn.RMSNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class GptFastLlama(nn.Module):
    """gpt-fast's ``Transformer`` (model.py): tok_embeddings, fused wqkv, w1/w3/w2, output.

    ``halves``: gpt-fast's names, transformers' rotary order.
    """

    def __init__(self, vocab: int, dim: int, n_layer: int, n_head: int, n_local_heads: int,
                 hidden: int, eps: float = 1e-6, base: float = 10000.0, *,
                 halves: bool = False) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(GptFastBlock(dim, n_head, n_local_heads, hidden, eps,
                                                 halves=halves)
                                    for _ in range(n_layer))
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.output = nn.Linear(dim, vocab, bias=False)
        self.head_dim, self.base = dim // n_head, base

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t, dev = idx.shape[1], idx.device
        freqs = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2, device=dev).float()
                                    / self.head_dim)
        angles = torch.outer(torch.arange(t, device=dev).float(), freqs)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, angles.cos(), angles.sin())
        return self.output(self.norm(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class NeoXAttention(nn.Module):
    """GPT-NeoX attention written with separate q, k, v; rotary (half-split) on a part."""

    def __init__(self, dim: int, n_head: int, rotary_dims: int) -> None:
        super().__init__()
        self.n_head, self.head_dim, self.rotary_dims = n_head, dim // n_head, rotary_dims
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def _rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot, rest = x[..., : self.rotary_dims], x[..., self.rotary_dims:]
        return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        q, k = self._rotary(q, cos, sin), self._rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class NeoXBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, rotary_dims: int, eps: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.ln2 = nn.LayerNorm(dim, eps=eps)
        self.attn = NeoXAttention(dim, n_head, rotary_dims)
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        mlp = self.proj(F.gelu(self.fc(self.ln2(x))))
        return x + self.attn(self.ln1(x), cos, sin) + mlp  # parallel residual


class NeoXGPT(nn.Module):
    """A hand-written GPT of GPT-NeoX's design (parallel residual, partial half-split rotary)."""

    def __init__(self, vocab: int, dim: int, n_layer: int, n_head: int, rotary_pct: float = 0.25,
                 eps: float = 1e-5, base: float = 10000.0) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            NeoXBlock(dim, n_head, int(dim // n_head * rotary_pct), eps) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.rotary_dims, self.base = int(dim // n_head * rotary_pct), base

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t, dev = idx.shape[1], idx.device
        inv = 1.0 / self.base ** (torch.arange(0, self.rotary_dims, 2, device=dev).float()
                                  / self.rotary_dims)
        angles = torch.outer(torch.arange(t, device=dev).float(), inv)
        angles = torch.cat([angles, angles], dim=-1)
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, angles.cos(), angles.sin())
        return self.head(self.ln_f(x))
