"""tg.export_onnx: unwrap, export at old and new opsets, check, compare with onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchgraft as tg
from tests.helpers import SmallNet, data_parallel_state

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("opset", [9, 11, 13, 17])
def test_export_matches_onnxruntime(tmp_path: Path, model: SmallNet, opset: int) -> None:
    x = torch.randn(2, 3, 8, 8)
    path = tmp_path / f"m{opset}.onnx"
    report = tg.export_onnx(nn.DataParallel(model), x, path, opset=opset, input_names=["x"],
                            output_names=["logits"], dynamic_axes={"x": {0: "batch"}})
    assert report.max_abs_diff is not None and report.max_abs_diff < 1e-5
    graph = onnx.load(str(path))
    assert graph.opset_import[0].version == opset
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    bigger = torch.randn(5, 3, 8, 8)
    (out,) = session.run(None, {"x": bigger.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(out, model.eval()(bigger).numpy(), rtol=1e-5, atol=1e-5)


def test_training_mode_is_restored_and_errors_are_ours(tmp_path: Path, model: SmallNet) -> None:
    model.train()
    tg.export_onnx(model, torch.randn(1, 3, 8, 8), tmp_path / "m.onnx", check=False)
    assert model.training
    with pytest.raises(tg.TorchgraftError, match="opset=5"):
        tg.export_onnx(model, torch.randn(1, 3, 8, 8), tmp_path / "x.onnx", opset=5)
    with pytest.raises(tg.TorchgraftError, match="failed on the example inputs"):
        tg.export_onnx(model, torch.randn(1, 5, 8, 8), tmp_path / "y.onnx")
    with pytest.raises(tg.TorchgraftError, match="already exists"):
        tg.export_onnx(model, torch.randn(1, 3, 8, 8), tmp_path / "m.onnx")


@pytest.mark.parametrize("out", ["net.pt", "net.onnx.bak", "net"])
def test_cli_export_refuses_an_output_that_is_not_onnx(tmp_path: Path, out: str) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "torchgraft", "export", "tests.helpers:SmallNet",
                             "--out", str(tmp_path / out), "--input-shape", "1,3,8,8"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "does not end with .onnx" in result.stderr
    assert not (tmp_path / out).exists()


@pytest.mark.slow
def test_cli_export_grafts_then_exports(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.helpers import small_net

    trained = small_net(seed=3)
    torch.save({"state_dict": data_parallel_state(trained)}, tmp_path / "ckpt.pth")
    out = tmp_path / "net.onnx"
    result = subprocess.run([sys.executable, "-m", "torchgraft", "export",
                             "tests.helpers:SmallNet", "--checkpoint", str(tmp_path / "ckpt.pth"),
                             "--out", str(out), "--input-shape", "1,3,8,8", "--opset", "9",
                             "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["graft"]["ok"] and data["export"]["max_abs_diff"] < 1e-4 and out.exists()
