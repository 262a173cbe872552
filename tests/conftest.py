from __future__ import annotations

import pytest
import torch

from tests.helpers import SmallNet, small_net


@pytest.fixture
def model() -> SmallNet:
    return small_net()


@pytest.fixture
def state(model: SmallNet) -> dict[str, torch.Tensor]:
    return model.state_dict()
