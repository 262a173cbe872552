"""The CLI settles a graft in one step and takes parts declared new: the advice it prints is a
command that works; ``--verify --source-model`` generates inputs from the models or takes
``--input-shape``; ``--new PATTERN``; the library's warning is not printed twice. Each case
with its control, through the entry point (exit codes and messages)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

Run = Callable[..., subprocess.CompletedProcess[str]]

MODELS = '''
from torch import nn
def net():
    m = nn.Sequential()
    m.lin = nn.Linear(4, 4)
    m.a = nn.LayerNorm(4)
    m.b = nn.LayerNorm(4)
    return m
def source():
    m = nn.Sequential()
    m.lin = nn.Linear(4, 4)
    m.p = nn.LayerNorm(4)
    m.r = nn.LayerNorm(4)
    return m
def norms():
    m = nn.Sequential()
    m.p = nn.LayerNorm(4)
    m.r = nn.LayerNorm(4)
    return m
def headed():
    m = source()
    m.head = nn.Linear(4, 3)
    return m
class Twice(nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.first, self.second, self.scale = nn.Linear(4, 4), nn.Linear(4, 4), scale
    def forward(self, x):
        return self.second(self.first(x) * self.scale)
'''

pytestmark = pytest.mark.slow


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "mymodels.py").write_text(MODELS)
    torch.manual_seed(0)
    trained = nn.Sequential()
    trained.lin = nn.Linear(4, 4)
    trained.p, trained.r = nn.LayerNorm(4), nn.LayerNorm(4)
    for norm in (trained.p, trained.r):
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    torch.save(trained.state_dict(), tmp_path / "ckpt.pt")
    return tmp_path


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr + result.stdout


def test_the_printed_advice_is_a_command_that_settles_the_graft(run: Run, folder: Path) -> None:
    models = folder / "mymodels.py"
    out = folder / "out.safetensors"
    graft = ["graft", str(folder / "ckpt.pt"), "--model", f"{models}:net", "--out", str(out)]
    unverified = run(*graft)
    assert unverified.returncode == 3 and not out.exists(), unverified.stderr
    assert "WARNING" not in unverified.stderr  # the report says it: not said twice
    assert "settle it with the command above" in unverified.stderr
    advice = shlex.split(unverified.stdout.splitlines()[-1])
    assert advice[:2] == ["torchgraft", "graft"] and "source_model=" not in unverified.stdout
    assert advice[-3:] == ["--verify", "--source-model", "MODULE:FACTORY"]
    command = [f"{models}:source" if word == "MODULE:FACTORY" else word for word in advice[1:]]
    settled = run(*command)
    assert settled.returncode == 0, settled.stdout + settled.stderr
    assert "graft ok" in settled.stdout and "max |output difference| = 0" in settled.stdout
    # --quiet prints no command: what is not saved says how to settle in flags instead
    quiet = run(*graft, "--quiet", "--overwrite")
    assert quiet.returncode == 3 and "command above" not in quiet.stderr, quiet.stderr
    assert "settle it with --verify --source-model MODULE:FACTORY" in quiet.stderr
    assert out.is_file()
    _no_traceback(settled)


def test_input_shape_feeds_the_comparison_and_bad_shapes_are_refused(run: Run,
                                                                    folder: Path) -> None:
    models = folder / "mymodels.py"
    torch.save({"p.weight": torch.randn(4), "p.bias": torch.randn(4), "r.weight": torch.randn(4),
                "r.bias": torch.randn(4)}, folder / "norms.pt")
    graft = ["graft", str(folder / "norms.pt"), "--model", f"{models}:norms", "--verify",
             "--source-model", f"{models}:norms"]
    shaped = run(*graft, "--input-shape", "2,4")
    assert shaped.returncode == 0 and "max |output difference| = 0" in shaped.stdout, \
        shaped.stdout + shaped.stderr
    nothing = run(*graft)  # the control: no module says what it takes
    assert nothing.returncode == 0 and "no inputs can be generated" in nothing.stdout
    assert "--input-shape N,C,H,W" in nothing.stdout and "example_inputs" not in nothing.stdout
    ids = run(*graft, "--input-shape", "1,8", "--input-dtype", "int64")
    assert ids.returncode == 2 and "has none" in ids.stderr and "--input-dtype" in ids.stderr
    bad = run(*graft, "--input-shape", "1,x")
    assert bad.returncode == 2 and "is not a shape such as 1,3,224,224" in bad.stderr
    both = run(*graft, "--input-shape", "2,4", "--inputs", str(folder / "norms.pt"))
    assert both.returncode == 2 and "give one" in both.stderr
    for result in (ids, bad, both):
        _no_traceback(result)


def test_new_declares_a_part_new_and_a_pattern_naming_nothing_is_refused(run: Run,
                                                                         folder: Path) -> None:
    models = folder / "mymodels.py"
    graft = ["graft", str(folder / "ckpt.pt"), "--model", f"{models}:headed", "--dry-run"]
    plain = run(*graft)
    assert plain.returncode == 1 and "missing" in plain.stdout  # the control: incomplete
    declared = run(*graft, "--new", "head", "--verify", "--source-model", f"{models}:source")
    assert declared.returncode == 0, declared.stdout + declared.stderr
    assert "new       head (2 keys)" in declared.stdout and "nothing saved" in declared.stdout
    assert "declared new" in declared.stdout
    nothing = run(*graft, "--new", "neck", "--new", "head")
    assert nothing.returncode == 2 and "new='neck' (CLI: --new)" not in nothing.stderr
    assert "--new neck names no key of the model" in " ".join(nothing.stderr.split())
    _no_traceback(nothing)


def test_a_diverged_graft_is_not_told_to_compare_outputs(run: Run, folder: Path) -> None:
    models = folder / "mymodels.py"
    torch.save({f"{name}.{part}": torch.randn(4, 4) if part == "weight" else torch.randn(4)
                for name in ("first", "second") for part in ("weight", "bias")},
               folder / "twice.pt")
    graft = ["graft", str(folder / "twice.pt"), "--source-model", f"{models}:Twice", "--verify",
             "--out", str(folder / "out.pt")]
    diverged = run(*graft, "--model", f"{models}:Twice", "--model-kwargs", '{"scale": 3.0}')
    assert diverged.returncode == 4, diverged.stdout + diverged.stderr
    assert "diverged" in diverged.stdout and "outputs were compared and differ" in diverged.stdout
    assert "to settle it, compare outputs" not in diverged.stdout
    assert "--input-shape" not in diverged.stdout and "the command above" not in diverged.stderr
    agreeing = run(*graft, "--model", f"{models}:Twice")  # the control
    assert agreeing.returncode == 0 and "graft ok" in agreeing.stdout


def test_save_rules_writes_what_was_settled_and_the_rules_need_no_search(run: Run,
                                                                         folder: Path) -> None:
    """The graft settled by the source's code is written as rules; fed back with --rules, the
    same file grafts ok with no comparison. Control: rules are never written for a graft that
    is not ok."""
    models = folder / "mymodels.py"
    rules = folder / "rules.json"
    graft = ["graft", str(folder / "ckpt.pt"), "--model", f"{models}:net", "--dry-run"]
    refused = run(*graft, "--save-rules", str(rules))
    assert refused.returncode == 3 and not rules.exists(), refused.stdout + refused.stderr
    assert f"rules not written to {rules}: the graft is not ok" in " ".join(
        refused.stdout.split())
    settled = run(*graft, "--verify", "--source-model", f"{models}:source", "--save-rules",
                  str(rules), "--json")
    assert settled.returncode == 0, settled.stdout + settled.stderr
    import json
    assert json.loads(settled.stdout)["rules"] == str(rules)
    ruled = run(*graft, "--rules", str(rules), "--no-verify")
    assert ruled.returncode == 0 and "graft ok" in ruled.stdout, ruled.stdout + ruled.stderr
    assert "guess" not in ruled.stdout and "compared" not in ruled.stdout
    _no_traceback(ruled)
