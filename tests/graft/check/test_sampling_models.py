"""A model whose forward draws random numbers: a difference then says nothing of the graft.

Both models run with their random numbers drawn from one seed (models that draw alike draw
the same), the caller's generator untouched. A model whose outputs still vary with the seed (a
VAE that samples its latent by default) is not compared: never "diverged" for its noise.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchgraft.graft.check.compare import NotComparable, compare

X = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))


class Net(nn.Module):
    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)
        self.noise = noise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return self.out(h + self.noise * torch.randn_like(h))


def _twins(noise: tuple[float, float]) -> tuple[Net, Net]:
    torch.manual_seed(0)
    source = Net(noise[0])
    target = Net(noise[1])
    target.load_state_dict(source.state_dict())
    return source, target


def test_a_model_that_samples_is_not_compared_with_one_that_does_not() -> None:
    source, target = _twins((0.0, 1.0))
    with pytest.raises(NotComparable, match="vary from run to run.*first at 'out'"):
        compare(source, target, X, X, module_map={"fc": "fc", "out": "out"})


def test_models_that_sample_alike_draw_the_same() -> None:
    source, target = _twins((1.0, 1.0))
    state = torch.random.get_rng_state()
    result = compare(source, target, X, X, module_map={"fc": "fc", "out": "out"})
    assert result.divergence is None
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator


def test_a_deterministic_model_that_differs_diverges() -> None:  # the control
    source, target = _twins((0.0, 0.0))
    with torch.no_grad():
        target.out.weight.add_(1.0)
    result = compare(source, target, X, X, module_map={"fc": "fc", "out": "out"})
    assert result.divergence is not None and "'out'" in result.divergence
