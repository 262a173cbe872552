"""The README reads in ten minutes, and its code runs as shown, in a clean folder.

Its setup is in the open: the first example defines the model it grafts into and writes the
file it reads, in the same block; nothing is collapsed or hidden. Every ``python`` block runs in
document order, in one namespace, in a fresh interpreter whose working folder is empty and
which cannot import the checkout's ``tests``, as a user's would. Where a block prints and the
README shows the printout as comments (``print(report)`` then ``# graft ok: ...``), what it
shows is what it prints, line for line. The screenshot in the docs
(docs/images/graft-report.png) is of the same graft: the browser test in
tests/cli/test_report_output.py checks its headline against this one.
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
#: The README's sections, in order: what it is and the two commands come before them.
SECTIONS = ["Graft a checkpoint into a model", "Read the verdict", "Settle a guess",
            "Declare new parts", "Save", "Command line", "Bad input", "Read more"]
#: About 150 lines: read top to bottom in ten minutes.
MOST_LINES = 170
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
    """Every python block of the README, in document order."""
    return _PYTHON.findall(README.read_text())


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
    assert len(blocks) >= 4
    work = tmp_path / "work"
    work.mkdir()
    plan = tmp_path / "blocks.json"
    plan.write_text(json.dumps([[code, shown_output(code)] for code in blocks]))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}  # torchgraft, not the checkout
    result = subprocess.run([sys.executable, "-P", "-c", RUNNER, str(plan)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-1000:] + result.stderr[-3000:]
    assert result.stdout.count(" ran\n") == len(blocks)


def test_the_readme_reads_in_ten_minutes() -> None:
    """About 150 lines, in the order a new user needs them; the rest is in docs/."""
    text = README.read_text()
    assert len(text.splitlines()) <= MOST_LINES
    assert re.findall(r"^## (.*)$", text, re.M) == SECTIONS


def test_the_readme_shows_its_setup_in_the_open() -> None:
    """The first example defines its model and writes its file, in the same block."""
    text = README.read_text()
    assert "<details>" not in text and "<!--" not in text  # nothing collapsed or hidden
    first = python_blocks()[0]
    assert len(first.splitlines()) <= 30
    graft = first.index("tg.graft(")
    assert first.index("def convnet(") < graft and first.index("torch.save(") < graft
    assert "import tests" not in first and "from tests" not in first


def test_every_link_of_the_readme_leads_to_a_page() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", README.read_text())
    assert "docs/benchmarks.md" in links and "docs/matching.md" in links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, missing


def test_the_readme_graft_headline_is_shown() -> None:
    """The first block shows the graft's headline (the browser test compares the screenshot)."""
    assert (shown_output(python_blocks()[0]) or [""])[0].startswith("graft ")


def test_readme_starts_with_the_demo_and_test_commands_and_ci_runs_the_second() -> None:
    """The first block of the README is the two commands a new user runs; CI runs the tests'."""
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None and text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert "about" in first.group(1) and "min" in first.group(1)  # how long each takes
    assert "exec bash scripts/test.sh" in (README.parent / ".ci" / "run").read_text()
