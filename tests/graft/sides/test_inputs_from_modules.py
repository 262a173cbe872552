"""Inputs generated from the models themselves: token ids in range of the first embedding,
images of the first convolution's channels in a size both models take, audio of the first
Conv1d's; a model that says nothing gets a clear message. Each with its control."""

from __future__ import annotations

import torch
from torch import nn

import torchgraft as tg
from torchgraft.graft.sides.inputs import from_modules


class _Tokens(nn.Module):
    def __init__(self, vocabulary: int) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(vocabulary, 8), nn.Linear(8, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(input_ids))


class _Patches(nn.Module):
    """A ViT-like model that takes 32 x 32 images only."""

    def __init__(self) -> None:
        super().__init__()
        self.patch, self.head = nn.Conv2d(3, 8, 16, 16), nn.Linear(8 * 4, 5)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.head(self.patch(pixel_values).flatten(1))


class _Audio(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(80, 8, 3)

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.conv(input_features).mean(-1)


def test_token_ids_stay_below_the_smallest_first_embedding() -> None:
    found = from_modules(_Tokens(50), _Tokens(30))
    ids = found[0]["token ids"]
    assert ids.dtype == torch.int64 and int(ids.max()) < 30 and ids.shape == (1, 8)
    assert not from_modules(nn.Sequential(nn.LayerNorm(4)))  # the control: nothing says


def test_images_in_a_size_the_models_take_are_found_and_compared() -> None:
    shapes = [tuple(i["pixel values"].shape) for i in from_modules(_Patches())
              if "pixel values" in i]
    assert shapes == [(1, 3, 224, 224), (1, 3, 64, 64), (1, 3, 32, 32)]
    report = tg.graft(_Patches().state_dict(), _Patches(), source_model=_Patches)
    assert report.ok and report.max_abs_diff == 0.0, str(report)  # 224 and 64 fail, 32 runs
    audio = tg.graft(_Audio().state_dict(), _Audio(), source_model=_Audio)
    assert audio.max_abs_diff == 0.0, str(audio)


def test_a_model_no_module_describes_gets_a_clear_message() -> None:
    class Norms(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.LayerNorm(4), nn.LayerNorm(4)

    source = Norms()
    report = tg.graft(source.state_dict(), Norms(), source_model=Norms, verify=True)
    assert report.max_abs_diff is None
    assert any("no inputs can be generated" in w and "example_inputs=" in w
               for w in report.warnings), report.warnings
    tokens = tg.graft(_Tokens(20).state_dict(), _Tokens(20), source_model=lambda: _Tokens(20),
                      verify=True)  # the control: ids from its embedding
    assert tokens.max_abs_diff == 0.0
