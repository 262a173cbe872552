"""``torchgraft inspect`` through its entry points: output, JSON, exit codes, errors."""

from __future__ import annotations

import enum
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.cli.conftest import CONSOLE_SCRIPT
from tests.helpers import Payload, SmallNet, data_parallel_state, save_on

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def dp_file(tmp_path: Path, model: SmallNet) -> Path:
    path = tmp_path / "dp.pth"
    save_on("cuda:1", {"epoch": 4, "state_dict": data_parallel_state(model)}, path)
    return path


@pytest.mark.slow
def test_table(run: Run, dp_file: Path) -> None:
    result = run("inspect", str(dp_file))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torch-zip" in out and "cuda:1" in out
    assert "'module.' (DataParallel / DistributedDataParallel)" in out
    assert "under 'state_dict'" in out and 'epoch: 4' in out
    assert re.search(r"^module\.conv\.weight +\(8, 3, 3, 3\) +float32 *$", out, re.MULTILINE)


@pytest.mark.slow
def test_json_and_console_script(dp_file: Path) -> None:
    assert CONSOLE_SCRIPT.exists()
    result = subprocess.run([str(CONSOLE_SCRIPT), "inspect", str(dp_file), "--json"],
                            capture_output=True, text=True, check=True)
    data = json.loads(result.stdout)
    assert data["format"] == "torch-zip"
    assert data["saved_devices"] == ["cuda:1"]
    assert data["wrappers"] == [{"prefix": "module.",
                                 "source": "DataParallel / DistributedDataParallel"}]
    assert data["totals"]["tensors"] == 9
    assert data["tensors"][0]["name"] == "module.conv.weight"


def test_missing_file_is_one_line_exit_2(run: Run, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pt"
    result = run("inspect", str(missing))
    assert result.returncode == 2
    assert result.stderr.strip() == f"torchgraft: error: {missing}: no such file or directory"
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_corrupt_file_and_debug_traceback(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    result = run("inspect", str(path))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert str(path) in result.stderr
    debug = run("--debug", "inspect", str(path))
    assert debug.returncode == 2 and "Traceback" in debug.stderr


@pytest.mark.slow
def test_unsafe_file_refused_then_opted_in(run: Run, tmp_path: Path) -> None:
    marker = tmp_path / "RAN"
    path = tmp_path / "payload.pt"
    torch.save({"w": torch.ones(2), "hook": Payload(marker)}, path)
    refused = run("inspect", str(path))
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert f"would run os.system('touch {marker}')" in refused.stderr
    assert "looks made to attack" in refused.stderr and "--unsafe" not in refused.stderr
    assert not marker.exists()
    allowed = run("inspect", str(path), "--unsafe", "--json")
    assert allowed.returncode == 0
    assert marker.exists()


class Mode(enum.Enum):  # an ordinary class a training script pickles
    FAST = 1


@pytest.mark.slow
def test_ordinary_constructors_are_recorded_and_only_they_mention_unsafe(run: Run,
                                                                         tmp_path: Path) -> None:
    """The twin of the attack above: a call of an ordinary class is recorded, not refused."""
    path = tmp_path / "hyper.pt"
    torch.save({"w": torch.ones(2), "mode": Mode.FAST}, path)
    shown = run("inspect", str(path))
    assert shown.returncode == 0
    assert "Mode (recorded, not called" in " ".join(shown.stdout.split())
    assert "--unsafe calls them, for a file you trust" in " ".join(shown.stdout.split())
    assert "attack" not in shown.stdout


def test_usage_errors_exit_2(run: Run) -> None:
    assert run("inspect").returncode == 2
    assert run("frobnicate").returncode == 2
    assert run("--help").returncode == 0


def test_help_and_version_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom torchgraft.cli.main import main\n"
            "for args in (['--help'], ['--version']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().endswith("False"), out.stdout
    assert "graft" in out.stdout and "0.1.0" in out.stdout


def test_completion_and_command_help_do_not_import_torch() -> None:
    """Completing a command's options and its --help load the command, never torch."""
    import os
    import subprocess
    import sys

    from torchgraft.cli.main import COMMANDS

    for name in COMMANDS:
        env = {**os.environ, "_TORCHGRAFT_COMPLETE": "bash_complete",
               "COMP_WORDS": f"torchgraft {name} --", "COMP_CWORD": "2"}
        code = ("import sys\nfrom torchgraft.cli.main import main\n"
                "try:\n    main([])\nexcept SystemExit:\n    pass\n"
                "print('torch' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True)
        assert "--json" in out.stdout or "--keep" in out.stdout, (name, out.stdout)
        assert out.stdout.strip().endswith("False"), (name, out.stdout)
        code = ("import sys\nfrom torchgraft.cli.main import main\n"
                f"try:\n    main([{name!r}, '--help'])\nexcept SystemExit:\n    pass\n"
                "print('torch' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        assert out.stdout.strip().endswith("False"), (name, out.stdout)


def test_every_listed_command_exists_with_that_help() -> None:
    import click

    from torchgraft.cli.main import COMMANDS, cli

    for name, (_module, _function, short) in COMMANDS.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and command.name == name
        assert (command.help or "").splitlines()[0].strip() == short, name


def test_debug_works_after_the_command(run: Run, tmp_path: Path) -> None:
    result = run("inspect", str(tmp_path / "missing.pt"), "--debug")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "no such file" in result.stderr


@pytest.mark.slow
def test_names_from_a_file_are_shown_safely(run: Run, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "odd.safetensors"
    save_file({"[bold red]x[/]": torch.ones(1), "line\nbreak\x1b[31m": torch.ones(1)}, path)
    result = run("inspect", str(path))
    assert result.returncode == 0
    assert "[bold red]x[/]" in result.stdout  # shown as text, not applied as markup
    assert "line\\nbreak\\x1b[31m" in result.stdout and "\x1b[31m" not in result.stdout
    missing = run("inspect", str(tmp_path / "no\nsuch.pt"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_summary_reads_well_at_80_columns(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    path = tmp_path / "one.pth"
    torch.save({"epoch": 1, "history": list(range(100)), "config": {"a": {"b": {"c": {"d": 1}}}},
                "note": "x" * 300, "state_dict": model.state_dict()}, path)
    result = subprocess.run([sys.executable, "-m", "torchgraft", "inspect", str(path)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "80"})
    out = result.stdout
    assert result.returncode == 0 and all(len(line) <= 80 for line in out.splitlines())
    assert "values  120 in parameters, 9 in 3 buffers" in out  # BatchNorm statistics apart
    assert "int64: 1 tensor, 1 value, 8 B" in out  # singular where it is one
    assert "history: [100 items: 0, 1, 2, ...]" in out and "d: " not in out  # summarised
    assert '    note: "xxx' in out and "..." in out
