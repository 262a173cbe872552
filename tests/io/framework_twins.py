"""PyTorch twins of models other frameworks wrote: attention (Keras, Flax) and BERT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg


class Projections(nn.Module):
    """The query, key, value and output projections, under the names given."""

    def __init__(self, names: tuple[str, str, str, str]) -> None:
        super().__init__()
        self.names = names
        for name in names:
            setattr(self, name, nn.Linear(8, 8))

    def forward(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v, out = (getattr(self, name) for name in self.names)

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, heads, -1).transpose(1, 2)

        weights = torch.softmax(split(q(x)) @ split(k(x)).transpose(-1, -2)
                                / (x.shape[-1] // heads) ** 0.5, dim=-1)
        return out((weights @ split(v(x))).transpose(1, 2).reshape(b, t, -1))  # type: ignore[no-any-return]


class AttentionTwin(nn.Module):
    """An Embedding(10, 8), 2-head attention with head size 4, then a Linear(8, 3).

    Args:
        names: The query, key, value and output projections' names (Keras: ``query``,
            ``key``, ``value``, ``attention_output``; Flax: ``out`` last).
        head: The last Linear's name.
        heads: The number of heads.
    """

    def __init__(self, *, names: tuple[str, str, str, str], head: str, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_name = heads, head
        self.embed = nn.Embedding(10, 8)
        self.attn = Projections(names)
        self.attn.head_dim = 8 // heads  # as transformers' attention modules state it
        setattr(self, head, nn.Linear(8, 3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mixed = self.attn(self.embed(ids), self.heads)
        return getattr(self, self.head_name)(mixed)  # type: ignore[no-any-return]


def assert_bert_grafts(path: Path, io_path: Path) -> None:
    """Graft a tiny BERT another framework wrote into transformers' BertModel: equal outputs.

    Args:
        path: The framework's file (``tf_model.h5``, ``flax_model.msgpack``).
        io_path: Its ``ids`` and the framework's ``last_hidden_state`` (``y``).
    """
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=16)
    model = transformers.BertModel(config).eval()
    io = np.load(io_path)
    report = tg.graft(path, model)
    assert report.ok, report
    with torch.no_grad():
        out = model(torch.from_numpy(io["ids"]).long()).last_hidden_state
    np.testing.assert_allclose(out.numpy(), io["y"], rtol=1e-5, atol=1e-5)
