"""The CLI on other frameworks' files: inspect shows framework and quantization, convert writes
PyTorch layouts, bad files exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import torchgraft as tg

Run = Callable[..., subprocess.CompletedProcess[str]]
FIXTURES = Path(__file__).parents[1] / "fixtures" / "frameworks"


def test_inspect_json_names_framework_and_quantization(run: Run) -> None:
    result = run("inspect", str(FIXTURES / "gguf" / "llama_mixed.gguf"), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["format"] == "gguf"
    assert info["extras"]["__metadata__"]["quantization"]["Q4_K"] == 4


@pytest.mark.slow
def test_inspect_of_an_mlx_lm_shard_says_mlx(run: Run) -> None:
    result = run("inspect", str(FIXTURES / "mlx" / "llama_q4" / "model.safetensors"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["format"] == "mlx"


@pytest.mark.slow
def test_convert_keras_to_safetensors(run: Run, tmp_path: Path) -> None:
    out = tmp_path / "cnn.safetensors"
    result = run("convert", str(FIXTURES / "keras" / "cnn.keras"), str(out))
    assert result.returncode == 0, result.stderr
    assert tg.load(out)["stem.weight"].shape == (4, 3, 3, 3)


@pytest.mark.slow
def test_truncated_gguf_exits_2(run: Run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes((FIXTURES / "gguf" / "llama_mixed.gguf").read_bytes()[:100])
    result = run("inspect", str(bad))
    assert result.returncode == 2
    assert "bad.gguf" in result.stderr


@pytest.mark.slow
def test_inspect_an_orbax_step_folder_and_refuse_a_damaged_one(run: Run, tmp_path: Path) -> None:
    result = run("inspect", str(FIXTURES / "orbax" / "nnx" / "7"), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["format"] == "orbax"
    assert info["extras"]["__metadata__"]["storage"] == "OCDBT, zarr v2"
    bad = tmp_path / "cnn"
    shutil.copytree(FIXTURES / "orbax" / "cnn", bad)
    (bad / "manifest.ocdbt").write_bytes((bad / "manifest.ocdbt").read_bytes()[:50])
    result = run("inspect", str(bad))
    assert result.returncode == 2
    assert "manifest.ocdbt" in result.stderr
