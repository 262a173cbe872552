"""Text from a file printed on a terminal is text: no markup, no terminal codes, through the
entry point; each hostile name with its control."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

#: Names that would style, clear, link or reverse what a terminal shows if printed as they are.
HOSTILE = {
    "markup": "a.[bold red]loud[/bold red].weight",
    "link": "b.[link=https://example.invalid]click[/link].weight",
    "clear": "c.\x1b[2J\x1b[Hcleared.weight",
    "osc": "d.\x1b]8;;https://example.invalid\x1b\\here\x1b]8;;\x1b\\.weight",
    "c1": "e.\x9b31mred.weight",  # an 8-bit CSI
    "bidi": "f.\u202egnp.exe.weight",  # shown reversed
}
PLAIN = "g.plain_name.weight"
CODES = ("\x1b[2J", "\x1b]8", "\x9b", "\u202e")


def _run(*args: str, color: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    if color:  # rich writes styles as on a terminal: markup read from a name would show
        env["FORCE_COLOR"] = "1"
    return subprocess.run([sys.executable, "-m", "torchgraft", *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("names") / "names.safetensors"
    save_file({name: torch.zeros(1) for name in [*HOSTILE.values(), PLAIN]}, str(path))
    return path


def _written_out(name: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


@pytest.mark.slow
@pytest.mark.parametrize("color", [False, True], ids=["piped", "terminal"])
def test_inspect_prints_names_as_text(hostile: Path, color: bool) -> None:
    result = _run("inspect", str(hostile), color=color)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert not any(code in out for code in CODES)
    for name in HOSTILE.values():
        assert _written_out(name) in out  # markup kept as brackets, codes written out
    assert PLAIN in out  # the control: a plain name as it is


@pytest.mark.slow
def test_inspect_json_is_ascii_and_gives_the_names_back(hostile: Path) -> None:
    result = _run("inspect", str(hostile), "--json", color=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.isascii() and "\x1b" not in result.stdout
    names = {t["name"] for t in json.loads(result.stdout)["tensors"]}
    assert names == {*HOSTILE.values(), PLAIN}  # the data is whole


@pytest.mark.slow
def test_graft_rows_print_names_as_text(hostile: Path, tmp_path: Path) -> None:
    models = tmp_path / "tiny.py"
    models.write_text("from torch import nn\n\n\nclass Tiny(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n"
                      "        self.g = nn.Module()\n"
                      "        self.g.plain_name = nn.Linear(1, 1, bias=False)\n")
    result = _run("graft", str(hostile), "--model", f"{models}:Tiny", "--dry-run", "--details",
                  color=True)
    out = result.stdout + result.stderr
    assert not any(code in out for code in CODES), out
    assert "unused" in out and _written_out(HOSTILE["markup"]) in out
    assert _written_out(HOSTILE["clear"]) in out


def test_progress_steps_show_a_files_name_as_text() -> None:
    from rich.progress import Progress

    from torchgraft.cli.progress import Steps

    bar = Progress()
    Steps(bar).step("converting [bold]x[/bold]\x1b[2J.pt")
    rendered = bar.tasks[0].description
    assert "\x1b" not in rendered
    from rich.text import Text

    assert Text.from_markup(rendered).plain == "converting [bold]x[/bold]\\x1b[2J.pt"


def test_log_lines_write_control_characters_out() -> None:
    from torchgraft.cli.main import OneLineFormatter

    formatter = OneLineFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord("t", logging.WARNING, __file__, 1, "key %s", ("a\x1b[2Jb\nc",),
                               None)
    assert formatter.format(record) == "WARNING key a\\x1b[2Jb\\nc"
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("t", logging.ERROR, __file__, 1, "plain", (), sys.exc_info())
    text = formatter.format(failed)  # the control: a traceback keeps its lines (--debug)
    assert text.startswith("ERROR plain\nTraceback") and "ValueError: boom" in text
