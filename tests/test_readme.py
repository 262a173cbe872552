"""The README's code runs as shown, in a clean folder, and prints the output it shows.

Its setup is visible: collapsed ``<details>`` blocks that define the models and write the files
the examples read. Every ``python`` block runs in document order, in one namespace, in a fresh
interpreter whose working folder is empty and which cannot import the checkout's ``tests``, as a
user's would. Where a block prints and the README shows the printout as comments
(``print(report)`` then ``# graft ok: ...``), what it shows is what it prints, line for line.
The screenshot beside the README (docs/images/graft-report.png) is of the same graft: the
browser test in tests/cli/test_report_output.py checks its headline against this one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
_DETAILS = re.compile(r"<details>.*?</details>", re.S)
_PYTHON = re.compile(r"```python\n(.*?)```", re.S)

#: Runs the blocks (a JSON list of [code, shown]) as a user would, then says how many ran.
RUNNER = """
import contextlib, io, json, sys
try:
    import tests.models
except ImportError:
    pass
else:
    sys.exit("the checkout's tests can be imported: not a user's setup")
namespace = {"__name__": "readme"}
for number, (code, shown) in enumerate(json.load(open(sys.argv[1])), start=1):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, f"README.md:python block {number}", "exec"), namespace)
    lines = printed.getvalue().splitlines()
    if shown is not None and lines != shown:
        sys.exit(f"python block {number} printed {lines!r}; the README shows {shown!r}")
    print(f"block {number} ran")
"""


def python_blocks() -> list[str]:
    """Every python block of the README, setup included, in document order."""
    return _PYTHON.findall(README.read_text())


def readme_blocks() -> tuple[str, list[str]]:
    """The README's setup (its ``<details>`` blocks, joined) and its other python blocks."""
    text = README.read_text()
    setup = "\n".join(code for details in _DETAILS.findall(text)
                      for code in _PYTHON.findall(details))
    return setup, _PYTHON.findall(_DETAILS.sub("", text))


def shown_output(block: str) -> list[str] | None:
    """The comment lines after each of the block's ``print(...)``: the output the README shows.

    ``None`` when the block shows no printout.
    """
    lines = block.splitlines()
    shown: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("print("):
            for comment in lines[i + 1:]:
                if not comment.startswith("# "):
                    break
                shown.append(comment.removeprefix("# "))
    return shown or None


@pytest.mark.slow
def test_every_python_block_runs_as_shown_in_a_clean_folder(tmp_path: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) >= 8 and "<!--setup" not in README.read_text()  # no hidden setup
    work = tmp_path / "work"
    work.mkdir()
    plan = tmp_path / "blocks.json"
    plan.write_text(json.dumps([[code, shown_output(code)] for code in blocks]))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # torchgraft, not the checkout
    result = subprocess.run([sys.executable, "-P", "-c", RUNNER, str(plan)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-3000:]
    assert result.stdout.count(" ran\n") == len(blocks)


def test_the_readme_shows_its_setup_in_the_open() -> None:
    """Each example's models and files come from a visible setup block, run before it."""
    setup, blocks = readme_blocks()
    assert "class ResNet18" in setup and "class NanoGPT" in setup and "class KerasCNN" in setup
    assert "import tests" not in setup and "from tests" not in setup
    first_example = README.read_text().index(f"```python\n{blocks[0]}")
    assert README.read_text().index("class ResNet18") < first_example


def test_the_readme_graft_headline_is_shown() -> None:
    """The first block shows the graft's headline (the browser test compares the screenshot)."""
    _setup, blocks = readme_blocks()
    assert (shown_output(blocks[0]) or [""])[0].startswith("graft ")


def test_readme_starts_with_the_demo_and_test_commands_and_ci_runs_the_second() -> None:
    """The first block of the README is the two commands a new user runs; CI runs the tests'."""
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "exec bash scripts/test.sh" in (README.parent / ".ci" / "run").read_text()
