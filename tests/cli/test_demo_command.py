"""``torchgraft demo``: the guided tour, through the entry point."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import torchgraft as tg
from torchgraft.cli.main import main

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.mark.slow
def test_demo_json(run: Run, tmp_path: Path) -> None:
    kept = tmp_path / "new" / "folder"  # made, as --keep makes a new folder
    result = run("demo", "--json", "--keep", str(kept))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kept"] == str(kept) and (kept / "lenet.safetensors").exists()
    steps = {step["file"]: step for step in data["inspect"]}
    assert len(steps) == 10
    refused = steps.pop("payload.pkl")
    assert refused["refused"] == "posix.system (os.system)"
    assert "Weights only load failed" in refused["plain_error"]  # what torch.load says
    for step in steps.values():
        assert step["loaded_on"] == ["cpu"]
        assert step["loaded_tensors"] == step["info"]["totals"]["tensors"] > 0
        assert step["python"].startswith("tg.load(") and step["cli"].startswith("torchgraft ")
    cuda = steps["dataparallel_cuda1.pth"]
    assert "Attempting to deserialize object on a CUDA device" in cuda["plain_error"]
    assert cuda["info"]["saved_devices"] == ["cuda:1"]
    assert cuda["info"]["wrappers"][0]["prefix"] == "module."
    formats = {step["info"]["format"] for step in steps.values()}
    assert formats == {"torch-zip", "torch-legacy", "safetensors", "sharded", "dcp", "paddle",
                       "numpy"}
    assert steps["whole_model.pt"]["info"]["model_class"] == "my_lab_models.LeNet"

    grafts = {step["title"]: step for step in data["graft"]}
    assert len(grafts) == 4 and all(step["passed"] for step in grafts.values())
    assert all(step["report"]["ok"] for step in grafts.values())
    variant = grafts["pretrained LeNet -> a 4-channel, 21-class variant"]
    assert "size mismatch" in variant["plain_error"]
    assert variant["report"]["adapted"]["fc3.weight"] == \
        "rows 10->21: 10 kept chosen by label_map, 11 new (init=keep)"
    renamed = grafts["LeNet rewritten as nn.Sequential: no name in common"]["report"]
    assert set(renamed["matched_by"].values()) == {"structure"}
    _printed_commands_run_in_the_kept_folder(data, kept)


def _graft(built: list[torch.nn.Module], path: str, model: torch.nn.Module,
           **options: object) -> object:
    """``tg.graft``, keeping the model it was given."""
    built.append(model)
    return tg.graft(path, model, **options)  # type: ignore[arg-type]


def _printed_commands_run_in_the_kept_folder(data: dict, folder: Path) -> None:
    """Every command line the tour prints runs, as printed, in the --keep folder."""
    assert (folder / "mymodels.py").is_file()
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for step in data["inspect"]:
            expected = 2 if "refused" in step else 0
            assert main(shlex.split(step["cli"])[1:]) == expected, step["cli"]
        for step in data["graft"]:
            words = shlex.split(step["cli"])
            torch.manual_seed(0)  # new rows keep the model's own values: the same on both sides
            assert main([*words[1:], "--quiet"]) == 0, step["cli"]
            out = Path(words[words.index("--out") + 1])
            built: list[torch.nn.Module] = []  # the printed library line, run as printed
            torch.manual_seed(0)
            exec(f"from mymodels import *\nreport = {step['python']}",
                 {"tg": SimpleNamespace(graft=functools.partial(_graft, built))})
            state = built[0].state_dict()
            saved = load_file(out)
            assert all(torch.equal(saved[k], state[k]) for k in saved), step["cli"]
    finally:
        os.chdir(cwd)
        sys.modules.pop("mymodels", None)


@pytest.mark.slow
def test_demo_text_is_a_tour_at_80_columns() -> None:
    result = subprocess.run([sys.executable, "-m", "torchgraft", "demo"], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("torchgraft gets any PyTorch checkpoint into any model")
    assert out.count("  PyTorch ") == 14 and out.count("  do it ") == 14
    announced = re.search(r"This tour shows (\d+) problems", " ".join(out.split()))
    assert announced is not None
    sections = re.findall(r"^─* ?(\d+)\. ", out, re.M)
    assert int(announced[1]) == len(sections) == 14, sections
    assert "removed" not in out.split("Part 2")[0]  # tg.load keeps names as stored
    assert out.count("passed ") >= 4 and "What the tour showed" in out and "Try next" in out
    assert "transposed (Paddle stores" in out
    assert "--keep DIR" in out and "temporary folder, now removed" in out
    assert "seed" not in out.lower()
    prose = [line for line in out.splitlines() if not line.lstrip().startswith(
        ("tg.", "torchgraft ", "do it"))]
    assert all(len(line) <= 80 for line in prose), [x for x in prose if len(x) > 80]
