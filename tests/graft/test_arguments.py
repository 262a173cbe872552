"""``tg.graft(model, "file")``, the order of ``safetensors.torch.load_model``, is understood."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import torchgraft as tg


def test_model_first_is_swapped_and_said(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trained = nn.Linear(3, 2)
    path = tmp_path / "model.safetensors"
    save_file(trained.state_dict(), path)
    model = nn.Linear(3, 2)
    report = tg.graft(model, path)  # type: ignore[arg-type]
    assert report.ok and torch.equal(model.weight, trained.weight)
    assert any("tg.graft(checkpoint, model)" in w for w in report.warnings)
    state = nn.Linear(3, 2)
    assert tg.graft(state, trained.state_dict()).ok  # type: ignore[arg-type]
    assert torch.equal(state.bias, trained.bias)


def test_no_model_on_either_side_says_the_order(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(2)}, path)
    for source, model in ((path, path), ({"w": torch.ones(2)}, str(path)), (path, None)):
        with pytest.raises(tg.TorchgraftError, match=r"the model must be an nn.Module.*"
                                                     r"the checkpoint .* comes first"):
            tg.graft(source, model)  # type: ignore[arg-type]
