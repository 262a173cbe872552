"""``torchgraft demo``: every seed scenario opens and loads on this CPU machine."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_demo_json(run: Run, tmp_path: Path) -> None:
    result = run("demo", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    steps = {step["title"]: step for step in json.loads(result.stdout)}
    assert len(steps) == 10
    refused = steps.pop("pickle with a code payload")
    assert refused["refused"] == "builtins.print"
    for step in steps.values():
        assert step["loaded_on"] == ["cpu"]
        assert step["loaded_tensors"] == step["info"]["totals"]["tensors"] > 0
    cuda = steps["DataParallel state dict saved on cuda:1"]["info"]
    assert cuda["saved_devices"] == ["cuda:1"]
    assert cuda["wrappers"][0]["prefix"] == "module."
    formats = {step["info"]["format"] for step in steps.values()}
    assert formats == {"torch-zip", "torch-legacy", "safetensors", "sharded", "dcp", "paddle",
                       "numpy"}
    whole = steps["whole pickled model whose class is gone"]["info"]
    assert whole["model_class"] == "my_lab_models.LeNet"


def test_demo_text(run: Run) -> None:
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("loaded 10 tensors") == 8
    assert "refused" in result.stdout
