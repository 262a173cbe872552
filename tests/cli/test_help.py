"""Help texts: accurate, complete, no stray control codes; tables the CLI keeps match the library's.

The command line checks arguments without torch, from tables of its own (output formats,
dtypes, opsets, reader names): each is compared here with the library's, so none drifts.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from torchgraft.cli.main import COMMANDS, EXIT_CODES, cli

README = Path(__file__).parents[2] / "README.md"


def _commands() -> list[click.Command]:
    context = click.Context(cli)
    found = [cli.get_command(context, name) for name in COMMANDS]
    assert all(found)
    return [c for c in found if c is not None]


def test_the_top_help_lists_every_exit_code_without_a_literal_backslash_b() -> None:
    result = subprocess.run([sys.executable, "-m", "torchgraft", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0
    assert "\\b" not in result.stdout and "\b" not in result.stdout
    text = " ".join(result.stdout.split())
    for code in ("0 ok", "1 incomplete", "2 bad input", "3 unverified", "4 diverged",
                 "5 saved anyway", "130 interrupted"):
        assert code in text, code


def test_every_option_of_every_command_says_what_it_does() -> None:
    for command in _commands():
        assert command.help and "\\b" not in command.help, command.name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help and len(param.help) > 15, (command.name, param.opts)
                assert "\\b" not in param.help


def test_graft_help_says_what_strict_and_match_do() -> None:
    graft = next(c for c in _commands() if c.name == "graft")
    helps = {p.name: p.help or "" for p in graft.params if isinstance(p, click.Option)}
    assert all(word in helps["match"] for word in ("name", "structure", "auto"))
    assert "every checkpoint key used" in helps["strict"] and "re-initialised" in helps["strict"]
    assert "5" in helps["allow_incomplete"] and "nothing" in helps["dry_run"]
    assert "5 saved anyway" in " ".join((graft.help or "").split())


def test_the_readme_lists_the_same_exit_codes() -> None:
    section = README.read_text().split("## Command line")[1].split("\n## ")[0]
    text = " ".join(section.split())
    for code in re.findall(r"(\d+) [a-z]", EXIT_CODES):
        assert f"`{code}`" in text or f"{code} " in text, code
    assert "saved anyway" in text and "130" in text


def test_the_output_formats_are_the_writers_the_library_registers() -> None:
    from torchgraft.cli.outputs import WRITERS
    from torchgraft.io import formats

    writers = {f.writes: f.suffixes for f in formats() if f.writes and f.write}
    assert writers == WRITERS


def test_the_dtype_choices_are_torch_floating_dtypes() -> None:
    import torch

    from torchgraft.dtype_names import CASTS
    from torchgraft.meta import parse_dtype

    assert all(parse_dtype(name).is_floating_point for name in CASTS)
    assert parse_dtype("bf16") is torch.bfloat16


def test_export_opsets_are_the_exporters() -> None:
    from torchgraft import onnx_export
    from torchgraft.cli.export_command import MAX_OPSET, MIN_OPSET

    assert (MIN_OPSET, MAX_OPSET) == (onnx_export.MIN_OPSET, onnx_export.MAX_OPSET)


def test_every_reader_has_a_name_users_know() -> None:
    from torchgraft.cli.words import READ_FORMATS
    from torchgraft.io import formats

    assert {f.name for f in formats()} <= set(READ_FORMATS)


@pytest.mark.parametrize("text, expected", [
    ("already exists; pass overwrite=True (CLI: --overwrite) to replace it",
     "already exists; pass --overwrite to replace it"),
    ("already exists; pass overwrite=True to replace it",
     "already exists; pass --overwrite to replace it"),
    ("format='paddle' (CLI: --format): use one of torch, numpy",
     "--format paddle: use one of torch, numpy"),
    ("re-initialised (init='keep'); pass label_map=... to keep rows that correspond",
     "re-initialised (--init keep); pass --label-map ... to keep rows that correspond"),
    ("'module.' removed from every key (keep_wrappers=True, CLI --keep-wrappers, keeps it)",
     "'module.' removed from every key (--keep-wrappers keeps it)"),
    ("ranks=2 (CLI: --ranks): a DCP directory", "--ranks 2: a DCP directory"),
    ("open with weights_key='ema'", "open with --weights-key ema"),
    ("verify=True needs something to compare with", "--verify needs something to compare with"),
])
def test_library_messages_are_read_in_flag_names(text: str, expected: str) -> None:
    from torchgraft.cli.words import cli_words

    assert cli_words(text) == expected


@pytest.mark.parametrize("text", ["x.format=3 and n_format=2", "a_label_map=1", "shape=(2, 3)",
                                  "the format of the file", "/data/rules=2/ckpt.pt: corrupt",
                                  "'format=x.weight' is not used"])
def test_text_that_names_no_argument_is_left_alone(text: str) -> None:
    from torchgraft.cli.words import cli_words

    assert cli_words(text) == text
