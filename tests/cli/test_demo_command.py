"""``torchgraft demo``: every example opens, loads on this CPU machine, and grafts."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

Run = Callable[..., subprocess.CompletedProcess[str]]


def test_demo_json(run: Run, tmp_path: Path) -> None:
    result = run("demo", "--json", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    steps = {step["title"]: step for step in data["inspect"]}
    assert len(steps) == 10
    refused = steps.pop("pickle with a code payload")
    assert refused["refused"] == "posix.system (os.system)"
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

    grafts = {step["title"]: step for step in data["graft"]}
    assert len(grafts) == 4 and all(step["passed"] for step in grafts.values())
    assert all(step["report"]["ok"] for step in grafts.values())
    variant = grafts["pretrained LeNet -> a 4-channel, 21-class variant"]["report"]
    assert variant["adapted"]["fc3.weight"] == \
        "rows 10->21: 10 kept chosen by label_map, 11 new (init=keep)"
    renamed = grafts["LeNet rewritten as nn.Sequential: no name in common"]["report"]
    assert set(renamed["matched_by"].values()) == {"structure"}


def test_demo_text(run: Run) -> None:
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("loaded 10 tensors") == 8
    assert "refused" in result.stdout
    assert result.stdout.count("check passed") == 4
    assert "Paddle stores Linear weights as [in, out]" in result.stdout
