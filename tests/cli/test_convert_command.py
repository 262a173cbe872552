"""``torchgraft convert`` and ``torchgraft export`` through the entry point."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.helpers import SmallNet, assert_same_state

Run = Callable[..., subprocess.CompletedProcess[str]]

MODELS = '''
from torch import nn
def net(num_classes=5):
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, num_classes))
'''


@pytest.mark.slow
def test_convert(run: Run, tmp_path: Path, model: SmallNet) -> None:
    src = tmp_path / "m.pth"
    torch.save({"epoch": 2, "state_dict": model.state_dict()}, src)
    result = run("convert", str(src), str(tmp_path / "m.safetensors"), "--dtype", "bf16",
                 "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["format"] == "safetensors" and report["extras_kept"] == ["epoch"]
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded["conv.weight"].dtype == torch.bfloat16
    again = run("convert", str(src), str(tmp_path / "m.safetensors"))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    legacy = run("convert", str(src), str(tmp_path / "old.pt"), "--legacy", "--drop-extras")
    assert legacy.returncode == 0
    assert_same_state(torch.load(tmp_path / "old.pt", weights_only=True), model.state_dict())


@pytest.mark.slow
def test_export(run: Run, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    (tmp_path / "mymodels.py").write_text(MODELS)
    torch.manual_seed(0)
    trained = nn.DataParallel(nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1),
                                            nn.Flatten(), nn.Linear(8, 10)))
    ckpt = tmp_path / "ckpt.pth"
    torch.save(trained.state_dict(), ckpt)
    out = tmp_path / "m.onnx"
    result = run("export", f"{tmp_path / 'mymodels.py'}:net", "--checkpoint", str(ckpt),
                 "--model-kwargs", '{"num_classes": 10}', "--out", str(out),
                 "--input-shape", "1,3,16,16", "--opset", "9", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["graft"]["ok"] and data["export"]["opset"] == 9
    assert data["export"]["max_abs_diff"] < 1e-5 and out.is_file()
    bad = run("export", f"{tmp_path / 'mymodels.py'}:net", "--out", str(tmp_path / "x.onnx"),
              "--input-shape", "1,3,x")
    assert bad.returncode == 2


@pytest.mark.slow
def test_convert_to_dcp_for_ranks(run: Run, tmp_path: Path, model: SmallNet) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "m.pth"
    torch.save({"epoch": 2, "state_dict": model.state_dict()}, src)
    result = run("convert", str(src), str(tmp_path / "ckpt"), "--ranks", "3", "--json")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == [
        "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    expected = model.state_dict()
    state = {"state_dict": {k: torch.empty_like(v) for k, v in expected.items()}, "epoch": 0}
    dcp.load(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)  # torch reads it
    assert_same_state(state["state_dict"], expected)
    assert state["epoch"] == 2
    wrong = run("convert", str(src), str(tmp_path / "m.safetensors"), "--ranks", "2")
    assert wrong.returncode == 2 and "--ranks" in wrong.stderr


@pytest.mark.slow
def test_convert_writes_stacked_experts_per_expert(run: Run, tmp_path: Path) -> None:
    torch.manual_seed(0)
    fused = {"layers.0.mlp.experts.gate_up_proj": torch.randn(3, 8, 5),
             "layers.0.mlp.experts.down_proj": torch.randn(3, 5, 4),
             "layers.0.mlp.gate.weight": torch.randn(3, 5)}
    torch.save(fused, tmp_path / "fused.pt")
    result = run("convert", str(tmp_path / "fused.pt"), str(tmp_path / "w1.safetensors"),
                 "--experts", "mixtral")
    assert result.returncode == 0, result.stderr
    written = load_file(tmp_path / "w1.safetensors")
    assert torch.equal(written["layers.0.block_sparse_moe.experts.2.w3.weight"],
                       fused["layers.0.mlp.experts.gate_up_proj"][2, 4:])
    assert torch.equal(written["layers.0.block_sparse_moe.gate.weight"],
                       fused["layers.0.mlp.gate.weight"])
    assert len(written) == 3 * 3 + 1
    bad = run("convert", str(tmp_path / "fused.pt"), str(tmp_path / "x.safetensors"),
              "--experts", "other")
    assert bad.returncode == 2 and "per-expert" in bad.stderr


def test_convert_says_what_killed_writes_left_and_it_removed_with_debug(run: Run,
                                                                          tmp_path: Path) -> None:
    from torchgraft.atomic import HOST

    src = tmp_path / "m.pth"
    torch.save({"w": torch.ones(2)}, src)
    out = tmp_path / "out"
    out.mkdir()
    dead = 2**22 + 12345  # above any pid this machine hands out
    stale = out / f".step-100.safetensors.tg-{HOST}-{dead}-abc.tmp"
    stale.write_bytes(b"a killed save's")
    result = run("--debug", "convert", str(src), str(out / "m.safetensors"))
    assert result.returncode == 0, result.stderr
    assert not stale.exists()
    assert f"removed {stale}, left by a write that no longer runs (process {dead})" in \
        result.stderr, result.stderr
