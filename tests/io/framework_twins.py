"""PyTorch twins of models other frameworks wrote: attention (Keras, Flax) and BERT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg


class Projections(nn.Module):
    """query, key, value and an output projection named as the framework names it."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self.output = output
        for name in ("query", "key", "value", output):
            setattr(self, name, nn.Linear(8, 8))


class AttentionTwin(nn.Module):
    """An Embedding(10, 8), 2-head attention with head size 4, then a Linear(8, 3).

    Args:
        output: The output projection's name (Keras ``attention_output``, Flax ``out``).
        head: The last Linear's name.
        heads: The number of heads.
    """

    def __init__(self, *, output: str, head: str, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_name = heads, head
        self.embed = nn.Embedding(10, 8)
        self.attn = Projections(output)
        setattr(self, head, nn.Linear(8, 3))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        b, t, _ = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, -1).transpose(1, 2)

        attn = self.attn
        q, k, v = (split(p(x)) for p in (attn.query, attn.key, attn.value))
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        mixed = getattr(attn, attn.output)((weights @ v).transpose(1, 2).reshape(b, t, -1))
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
