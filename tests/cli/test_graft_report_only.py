"""A graft that only reports (no --out, or --dry-run), and exit codes that say what was saved.

Exit codes: the verdict's (0, 1, 3, 4) when nothing was saved or asked to be; 5 when
--allow-incomplete saved a graft that is not ok.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import data_parallel_state

Run = Callable[..., subprocess.CompletedProcess[str]]

MODELS = '''
from torch import nn
def net(num_classes=10):
    m = nn.Sequential()
    m.conv = nn.Conv2d(3, 8, 3)
    m.fc = nn.Linear(8, num_classes)
    return m
'''

pytestmark = pytest.mark.slow


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "mymodels.py").write_text(MODELS)
    torch.manual_seed(0)
    trained = nn.Sequential()
    trained.conv = nn.Conv2d(3, 8, 3)
    trained.fc = nn.Linear(8, 10)
    torch.save(data_parallel_state(trained), tmp_path / "ckpt.pth")
    return tmp_path


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "__pycache__")


def test_without_out_a_graft_is_reported_and_nothing_is_saved(run: Run, folder: Path) -> None:
    before = _files(folder)
    graft = ["graft", str(folder / "ckpt.pth"), "--model", f"{folder / 'mymodels.py'}:net"]
    ok = run(*graft)
    assert ok.returncode == 0, ok.stderr
    assert "graft ok" in ok.stdout and "report only: nothing saved" in ok.stdout
    assert ok.stderr == ""
    incomplete = run(*graft, "--no-adapt", "--model-kwargs", '{"num_classes": 21}', "--json")
    assert incomplete.returncode == 1  # the verdict's code: nothing was asked to be saved
    data = json.loads(incomplete.stdout)
    assert data["verdict"] == "incomplete" and data["out"] is None and data["error"] is None
    assert data["exit_code"] == 1
    assert _files(folder) == before


def test_dry_run_checks_out_and_saves_nothing(run: Run, folder: Path) -> None:
    graft = ["graft", str(folder / "ckpt.pth"), "--model", f"{folder / 'mymodels.py'}:net"]
    out = folder / "out.safetensors"
    dry = run(*graft, "--out", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: nothing saved" in dry.stdout and not out.exists()
    out.write_bytes(b"the old file")
    taken = run(*graft, "--out", str(out), "--dry-run")
    assert taken.returncode == 2 and "--overwrite" in taken.stderr  # the real run would fail
    again = run(*graft, "--out", str(out), "--dry-run", "--overwrite")
    assert again.returncode == 0 and out.read_bytes() == b"the old file"
    saved = run(*graft, "--out", str(out), "--overwrite")  # the twin: the same, saved
    assert saved.returncode == 0 and f"saved {out}" in saved.stdout
    assert out.read_bytes() != b"the old file"


def test_saved_anyway_is_exit_5_and_not_saved_is_the_verdicts_code(run: Run,
                                                                  folder: Path) -> None:
    graft = ["graft", str(folder / "ckpt.pth"), "--model", f"{folder / 'mymodels.py'}:net",
             "--no-adapt", "--model-kwargs", '{"num_classes": 21}']
    refused = run(*graft, "--out", str(folder / "a.pt"))
    assert refused.returncode == 1 and not (folder / "a.pt").exists()
    assert "not saved to" in refused.stderr and "exit 5" in refused.stderr
    kept = run(*graft, "--out", str(folder / "a.pt"), "--allow-incomplete")
    assert kept.returncode == 5 and (folder / "a.pt").is_file()
    assert "saved" in kept.stdout
