"""One container whose blocks take turns (attention, then MLP) against blocks of one kind."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg
from tests.graft.pairs.values import drawn
from torchgraft.graft.evidence import Verdict

DIM, HIDDEN, LAYERS = 8, 12, 3
X = torch.randn(2, DIM, generator=torch.Generator().manual_seed(0))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.q, self.o = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.o(torch.tanh(self.q(self.norm(x))))


class Feed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Turns(nn.Module):
    """``stack.{2i}`` an attention, ``stack.{2i+1}`` a feed-forward (x-transformers' way)."""

    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.stack = nn.ModuleList(m for _ in range(layers) for m in (Attention(), Feed()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self.stack:
            x = module(x)
        return x


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_a, self.attn_in, self.attn_out = nn.LayerNorm(DIM), nn.Linear(DIM, DIM), \
            nn.Linear(DIM, DIM)
        self.ln_b, self.fc_in, self.fc_out = nn.LayerNorm(DIM), nn.Linear(DIM, HIDDEN), \
            nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn_out(torch.tanh(self.attn_in(self.ln_a(x))))
        return x + self.fc_out(torch.relu(self.fc_in(self.ln_b(x))))


class Blocks(nn.Module):
    """``blocks.{i}`` holding both, under other names."""

    def __init__(self, layers: int = LAYERS) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Layer() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _layer(key: str) -> int:
    """The layer a key belongs to: ``blocks.{i}``, or the turn ``stack.{2i}``/``stack.{2i+1}``."""
    container, index = key.split(".")[:2]
    return int(index) // 2 if container == "stack" else int(index)


def _sorted_file(model: nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_turns_from_a_sorted_file_fill_blocks_and_back(tmp_path: Path) -> None:
    """Both ways from sorted files: the turns of block k are block k (its same-shape
    projections, in and out, a guess no name settles); every tensor filled, and the source's
    model settles the guesses: ok, outputs equal."""
    for source, target in ((drawn(Turns()), Blocks().eval()), (drawn(Blocks()), Turns().eval())):
        path = _sorted_file(source, tmp_path / "s.safetensors")
        report = tg.graft(path, target)
        assert report.verdict is Verdict.UNVERIFIED and report.guesses, report
        assert all(_layer(report.mapping[k]) == _layer(k) for k in report.mapping), report
        settled = tg.graft(path, target, source_model=source, example_inputs=(X,))
        assert settled.ok, settled
        with torch.no_grad():
            assert torch.allclose(target(X), source(X), atol=1e-5)


def test_turns_of_another_depth_are_never_ok(tmp_path: Path) -> None:
    """The twin: four turns of layers into three blocks: never ok."""
    path = _sorted_file(drawn(Turns(layers=LAYERS + 1)), tmp_path / "deeper.safetensors")
    assert tg.graft(path, Blocks()).verdict is not Verdict.OK
