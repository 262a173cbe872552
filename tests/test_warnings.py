"""A graft that is not ok cannot be missed: a script that never prints shows one
``TorchgraftWarning``, once per line of its code, filterable like any warning; so do arguments
given in the other order. ``dir(torchgraft)`` shows the public names only. Each case with its
control, in a fresh interpreter as a user's script runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchgraft as tg

_SETUP = """
import warnings
import torch
from torch import nn
import torchgraft as tg
torch.save({"0.weight": torch.zeros(2, 2)}, "weights_only.pt")  # no bias: incomplete
torch.save(nn.Sequential(nn.Linear(2, 2)).state_dict(), "whole.pt")
"""


def _script(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(_SETUP + textwrap.dedent(body))
    return subprocess.run([sys.executable, *flags, str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_bad_graft_shows_one_warning_without_a_print(tmp_path: Path) -> None:
    bad = _script(tmp_path, """
        for _ in range(3):  # one line, three grafts: one warning
            tg.graft("weights_only.pt", nn.Sequential(nn.Linear(2, 2)))
    """)
    assert bad.returncode == 0 and bad.stdout == ""
    assert bad.stderr.count("TorchgraftWarning") == 1, bad.stderr
    assert f"{tmp_path / 'train.py'}:10: TorchgraftWarning: graft INCOMPLETE" in bad.stderr
    assert "missing   0.bias" in bad.stderr and "new=" in bad.stderr  # what and how to fix
    good = _script(tmp_path, """
        for _ in range(3):
            tg.graft("whole.pt", nn.Sequential(nn.Linear(2, 2)))
    """)
    assert good.returncode == 0 and good.stderr == ""  # the control: nothing to say


@pytest.mark.slow
def test_the_warning_is_filtered_like_any_warning(tmp_path: Path) -> None:
    body = 'tg.graft("weights_only.pt", nn.Sequential(nn.Linear(2, 2)))\n'
    ignored = _script(tmp_path, "warnings.simplefilter('ignore', tg.TorchgraftWarning)\n" + body)
    assert ignored.returncode == 0 and ignored.stderr == ""
    raised = _script(tmp_path, body, "-W", "error::UserWarning")  # a UserWarning
    assert raised.returncode == 1 and "TorchgraftWarning: graft INCOMPLETE" in raised.stderr


@pytest.mark.slow
def test_swapped_arguments_warn_once(tmp_path: Path) -> None:
    swapped = _script(tmp_path, """
        report = tg.graft(nn.Sequential(nn.Linear(2, 2)), "whole.pt")
        assert report.ok
    """)
    assert swapped.returncode == 0, swapped.stderr
    assert swapped.stderr.count("TorchgraftWarning") == 1
    assert "the order is tg.graft(checkpoint, model)" in swapped.stderr
    ordered = _script(tmp_path, """
        assert tg.graft("whole.pt", nn.Sequential(nn.Linear(2, 2))).ok
    """)
    assert ordered.returncode == 0 and ordered.stderr == ""  # the control


def test_the_warning_is_public_and_a_user_warning() -> None:
    assert issubclass(tg.TorchgraftWarning, UserWarning)
    assert "TorchgraftWarning" in tg.__all__ and tg.TorchgraftWarning is tg.errors.TorchgraftWarning


def test_dir_shows_the_public_names_only() -> None:
    shown = dir(tg)
    for name in ("Any", "sys", "logging", "importlib", "types", "annotations", "TYPE_CHECKING"):
        assert name not in shown, name
    assert set(tg.__all__) <= set(shown)  # the control: every public name is there
    assert all(getattr(tg, name) is not None for name in tg.__all__)
