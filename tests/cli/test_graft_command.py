"""``torchgraft graft`` and ``torchgraft diff`` through the entry point."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.helpers import data_parallel_state, save_on

Run = Callable[..., subprocess.CompletedProcess[str]]

MODELS = '''
from torch import nn
def net(num_classes=5, in_chans=3):
    m = nn.Sequential()
    m.conv = nn.Conv2d(in_chans, 8, 3)
    m.fc = nn.Linear(8, num_classes)
    return m
'''


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    models = tmp_path / "mymodels.py"
    models.write_text(MODELS)
    torch.manual_seed(0)
    trained = nn.Sequential()
    trained.conv = nn.Conv2d(3, 8, 3)
    trained.fc = nn.Linear(8, 10)
    ckpt = tmp_path / "ckpt.pth"
    save_on("cuda:1", {"epoch": 2, "state_dict": data_parallel_state(trained)}, ckpt)
    return models, ckpt, trained.state_dict()


@pytest.mark.slow
def test_graft_adapts_and_saves_safetensors(run: Run, tmp_path: Path, setup: tuple) -> None:
    models, ckpt, trained = setup
    out = tmp_path / "out.safetensors"
    result = run("graft", str(ckpt), "--model", f"{models}:net", "--model-kwargs",
                 '{"num_classes": 21, "in_chans": 4}', "--out", str(out), "--label-map",
                 json.dumps(list(range(10))))
    assert result.returncode == 0, result.stderr
    assert "graft ok" in result.stdout
    assert "rows 10->21: 10 kept chosen by label_map, 11 new" in result.stdout
    saved = load_file(out)
    assert torch.equal(saved["conv.weight"][:, :3], trained["conv.weight"])
    assert torch.equal(saved["fc.bias"][:10], trained["fc.bias"])


@pytest.mark.slow
def test_graft_json_missing_and_strict_exit_1(run: Run, tmp_path: Path, setup: tuple) -> None:
    models, ckpt, _ = setup
    args = ["graft", str(ckpt), "--model", f"{models}:net", "--model-kwargs",
            '{"num_classes": 21}']
    refused = run(*args, "--out", str(tmp_path / "a.pt"), "--no-adapt", "--json")
    assert refused.returncode == 1 and not (tmp_path / "a.pt").exists()
    data = json.loads(refused.stdout)
    assert data["out"] is None and "--allow-incomplete" in data["error"]
    plain = run(*args, "--out", str(tmp_path / "a.pt"), "--no-adapt")
    assert plain.returncode == 1 and not (tmp_path / "a.pt").exists()
    assert "not saved to" in plain.stderr and "--allow-incomplete" in plain.stderr
    assert "not saved" not in plain.stdout  # the report on stdout, the refusal on stderr
    result = run(*args, "--out", str(tmp_path / "a.pt"), "--no-adapt", "--json",
                 "--allow-incomplete")
    assert result.returncode == 5  # saved anyway: not 1, which says nothing was saved
    data = json.loads(result.stdout)
    assert data["missing"] == ["fc.weight", "fc.bias"] and data["out"] == str(tmp_path / "a.pt")
    assert set(torch.load(tmp_path / "a.pt", weights_only=True)) == {"conv.weight", "conv.bias",
                                                                      "fc.weight", "fc.bias"}
    strict = run(*args, "--out", str(tmp_path / "b.pt"), "--no-adapt", "--strict")
    assert strict.returncode == 1
    assert "strict graft failed: Cannot load 'fc.weight'" in strict.stderr
    assert not (tmp_path / "b.pt").exists()


@pytest.mark.slow
def test_graft_bad_input_exit_2(run: Run, tmp_path: Path, setup: tuple) -> None:
    models, ckpt, _ = setup
    existing = tmp_path / "exists.pt"
    existing.write_bytes(b"keep me")
    cases = [
        (["--model", "nope_module:net", "--out", str(tmp_path / "x.pt")], "cannot import"),
        (["--model", f"{models}:net", "--model-kwargs", "{oops", "--out",
          str(tmp_path / "x.pt")], "not valid JSON"),
        (["--model", f"{models}:net", "--out", str(existing)], "--overwrite"),
        (["--model", "no-colon", "--out", str(tmp_path / "x.pt")], "MODULE:FACTORY"),
    ]
    for extra, message in cases:
        result = run("graft", str(ckpt), *extra)
        assert result.returncode == 2, (extra, result.stderr)
        assert message in result.stderr
    assert existing.read_bytes() == b"keep me"
    missing = run("graft", str(tmp_path / "nope.pt"), "--model", f"{models}:net", "--out",
                  str(tmp_path / "y.pt"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


@pytest.mark.slow
def test_diff(run: Run, tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.safetensors"
    torch.save({"w": torch.ones(3), "v": torch.zeros(2)}, a)
    from safetensors.torch import save_file

    save_file({"w": torch.ones(3), "v": torch.zeros(2)}, b)
    same = run("diff", str(a), str(b))
    assert same.returncode == 0 and "identical: 2 tensors" in same.stdout
    save_file({"w": torch.ones(3) * 2, "u": torch.zeros(2)}, b)
    result = run("diff", str(a), str(b), "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["values"] == {"w": 1.0} and data["only_in_a"] == ["v"]
    assert data["only_in_b"] == ["u"]


GUESSING = '''
from torch import nn
def net():
    m = nn.Sequential()
    m.a = nn.LayerNorm(4)
    m.b = nn.LayerNorm(4)
    return m
'''


@pytest.mark.slow
def test_graft_unverified_exit_3(run: Run, tmp_path: Path) -> None:
    """Two same-shape norms under names nothing relates: filled, but a guess (exit 3)."""
    models = tmp_path / "guessing.py"
    models.write_text(GUESSING)
    source = nn.Sequential()
    source.p = nn.LayerNorm(4)
    source.r = nn.LayerNorm(4)
    torch.save(source.state_dict(), tmp_path / "s.pt")
    args = ["graft", str(tmp_path / "s.pt"), "--model", f"{models}:net"]
    result = run(*args, "--out", str(tmp_path / "a.pt"))
    assert result.returncode == 3, result.stderr
    assert "graft UNVERIFIED" in result.stdout
    assert result.stdout.splitlines()[-1].split() == [
        "torchgraft", *args, "--out", str(tmp_path / "a.pt"), "--verify", "--source-model",
        "MODULE:FACTORY"]  # the command that settles it, ready to copy
    assert not (tmp_path / "a.pt").exists() and "--allow-unverified" in result.stderr
    assert "--allow-incomplete" not in result.stderr  # the flag for missing keys is not named
    data = json.loads(run(*args, "--out", str(tmp_path / "b.pt"), "--json").stdout)
    assert data["verdict"] == "unverified" and data["evidence"]["a.weight"] == "guess"
    assert data["out"] is None and not (tmp_path / "b.pt").exists()
    kept = run(*args, "--out", str(tmp_path / "c.pt"), "--allow-unverified")
    assert kept.returncode == 5 and (tmp_path / "c.pt").is_file()
    kept = run(*args, "--out", str(tmp_path / "d.pt"), "--allow-incomplete")  # as before
    assert kept.returncode == 5 and (tmp_path / "d.pt").is_file()
    assert data["guesses"]["a.weight"]["alternatives"] == ["r.weight"]
    assert "3 unverified" in run("graft", "--help").stdout.replace("\n", " ")


ATTENTION = '''
from torch import nn
def attn():
    m = nn.Sequential()
    m.attention = nn.MultiheadAttention(8, 2)
    return m
'''


@pytest.mark.slow
def test_graft_assumption_exit_3(run: Run, tmp_path: Path) -> None:
    """A bare file of another code base into a model with attention: its head count is assumed."""
    models = tmp_path / "attention.py"
    models.write_text(ATTENTION)
    source = nn.Sequential()
    source.mha = nn.MultiheadAttention(8, 2)
    torch.save(source.state_dict(), tmp_path / "s.pt")
    args = ["graft", str(tmp_path / "s.pt"), "--model", f"{models}:attn"]
    result = run(*args, "--out", str(tmp_path / "a.pt"), "--details")
    assert result.returncode == 3, result.stderr
    assert "assumed attention head count: the model's: 2 heads, head size 4" in " ".join(
        result.stdout.split())
    assert not (tmp_path / "a.pt").exists() and "UNVERIFIED" in result.stderr
    data = json.loads(run(*args, "--out", str(tmp_path / "b.pt"), "--json").stdout)
    assert data["verdict"] == "unverified" and not data["guesses"]
    assert data["assumptions"][0]["assumed"] == "the model's: 2 heads, head size 4"
    html = run(*args, "--out", str(tmp_path / "c.pt"), "--html", str(tmp_path / "r.html"))
    assert html.returncode == 3
    assert "assumed: attention head count" in (tmp_path / "r.html").read_text()
