"""PaddlePaddle .pdparams written by real paddle, read without paddle."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torchgraft as tg
from tests.helpers import assert_same_state

paddle = pytest.importorskip("paddle")


def _resnet18_state() -> dict[str, np.ndarray]:
    from paddle.vision.models import resnet18

    paddle.seed(0)
    model = resnet18(num_classes=10)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape))
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def resnet_state() -> dict[str, np.ndarray]:
    return _resnet18_state()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_real_paddle_resnet18(tmp_path: Path, resnet_state: dict[str, np.ndarray],
                              protocol: int) -> None:
    path = tmp_path / "resnet18.pdparams"
    paddle.save({k: paddle.to_tensor(v) for k, v in resnet_state.items()}, str(path),
                protocol=protocol)
    with tg.open(path) as ckpt:
        assert ckpt.format == "paddle"
        assert ckpt.keys() == list(resnet_state)
        assert ckpt.meta("fc.weight").shape == (512, 10)  # Paddle's Linear is [in, out]
        assert "bn1._mean" in ckpt.keys() and "bn1._variance" in ckpt.keys()
    expected = {k: torch.from_numpy(v) for k, v in resnet_state.items()}
    assert_same_state(tg.load(path), expected)


@pytest.mark.slow
def test_reads_without_paddle_installed(tmp_path: Path,
                                        resnet_state: dict[str, np.ndarray]) -> None:
    path = tmp_path / "resnet18.pdparams"
    paddle.save({k: paddle.to_tensor(v) for k, v in resnet_state.items()}, str(path))
    script = (
        "import sys, json; sys.modules['paddle'] = None\n"
        "import torchgraft as tg\n"
        f"sd = tg.load({str(path)!r})\n"
        "assert 'paddle' not in sys.modules or sys.modules['paddle'] is None\n"
        "print(json.dumps({k: float(v.double().sum()) for k, v in sd.items()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True).stdout
    sums = json.loads(out)
    assert list(sums) == list(resnet_state)
    for name, array in resnet_state.items():
        assert sums[name] == pytest.approx(float(array.astype(np.float64).sum()), rel=1e-12)


def test_big_parameters_split_by_paddle_are_joined(tmp_path: Path) -> None:
    from paddle.framework.io_utils import _pack_loaded_dict

    # The layout paddle.save uses for arrays over 1 GiB with protocol 2/3 (io_utils.
    # _unpack_saved_dict), written small: slices of the flattened array plus a table.
    big = np.arange(30, dtype=np.float32).reshape(5, 6)
    flat = big.reshape(-1)
    saved = {"small": np.ones(3, np.float32), "big@@.0": flat[:12], "big@@.1": flat[12:24],
             "big@@.2": flat[24:],
             "UnpackBigParamInfor@@": {"big": {"OriginShape": (5, 6),
                                               "slices": ["big@@.0", "big@@.1", "big@@.2"]}}}
    path = tmp_path / "split.pdparams"
    with path.open("wb") as f:
        pickle.dump(saved, f, protocol=2)
    with path.open("rb") as f:
        paddle_view = _pack_loaded_dict(pickle.load(f, encoding="latin1"))
    loaded = tg.load(path)
    assert sorted(loaded) == sorted(paddle_view) == ["big", "small"]
    for name, array in paddle_view.items():
        assert torch.equal(loaded[name], torch.from_numpy(array))
