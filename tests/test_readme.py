"""The README's code runs as written, and the output it shows is what the code prints.

Its hidden setup (an HTML comment ``<!--setup ... -->``, as in docs/) makes the files the README
talks about; then every ``python`` block runs in order, in one namespace, in a fresh folder.
Where a block prints and the README shows the printout as comments (``print(report)`` then
``# graft ok: ...``), the first line shown is the first line printed. The screenshot beside the
README (docs/images/graft-report.png) is of the same graft: the browser test in
tests/cli/test_report_output.py checks its headline against this one.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
_SETUP = re.compile(r"<!--setup\n(.*?)-->", re.S)
_PYTHON = re.compile(r"```python\n(.*?)```", re.S)


def readme_blocks() -> tuple[str, list[str]]:
    """The README's hidden setup and its python blocks, in order."""
    text = README.read_text()
    return "\n".join(_SETUP.findall(text)), _PYTHON.findall(_SETUP.sub("", text))


def shown_output(block: str) -> str | None:
    """The first comment line after the block's ``print(...)``: the output the README shows."""
    lines = block.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("print(") and lines[i + 1].startswith("# "):
            return lines[i + 1].removeprefix("# ")
    return None


@pytest.mark.slow
def test_every_python_block_runs_and_prints_what_it_shows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup, blocks = readme_blocks()
    assert setup and len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(setup, "README.md:setup", "exec"), namespace)
    for number, block in enumerate(blocks, start=1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"README.md:python block {number}", "exec"), namespace)
        shown = shown_output(block)
        if shown is not None:
            assert printed.getvalue().splitlines()[0] == shown, f"python block {number}"


def test_the_readme_graft_headline_is_shown() -> None:
    """The first block shows the graft's headline (the browser test compares the screenshot)."""
    _setup, blocks = readme_blocks()
    assert (shown_output(blocks[0]) or "").startswith("graft ")


def test_readme_starts_with_the_demo_and_test_commands_and_ci_runs_the_second() -> None:
    """The first block of the README is the two commands a new user runs; CI runs the tests'."""
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (README.parent / ".ci" / "run").read_text()
