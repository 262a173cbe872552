from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import dcp_writer
from tests.helpers import SmallNet, small_net


@pytest.fixture(scope="session")
def two_rank_dcp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DCP checkpoint written by 2 gloo processes (see tests/dcp_writer.py)."""
    return dcp_writer.write(tmp_path_factory.mktemp("dcp") / "ckpt")


@pytest.fixture
def model() -> SmallNet:
    return small_net()


@pytest.fixture
def state(model: SmallNet) -> dict[str, torch.Tensor]:
    return model.state_dict()
