"""The docs: every page's code runs as written, and the site builds with ``mkdocs --strict``.

A page's hidden setup (an HTML comment ``<!--setup ... -->``, which makes the files the page
talks about) runs first, then each ``python`` block in order, in one namespace, in a fresh
folder; where a block prints and the page shows the printout as comments after the
``print(...)``, what it shows is what it prints, line for line. Command lines (``bash``
blocks, continued lines joined) run in another folder where only the setup ran, when the files
they read are there (not those that need a model module the page does not write).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme import shown_output

DOCS = Path(__file__).parents[1] / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
_SETUP = re.compile(r"<!--setup\n(.*?)-->", re.S)
#: Pages whose command lines need a model module or a GPU run: their Python code covers them.
NO_CLI_RUN = {"index.md", "modified-architecture.md", "new-head.md", "onnx.md", "multi-gpu.md",
              "install.md", "matching.md", "assumptions.md", "formats.md", "frameworks.md",
              "cli.md", "benchmarks.md", "architecture.md"}
_BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)


def _blocks(page: str) -> tuple[str, list[tuple[str, str]]]:
    text = (DOCS / page).read_text()
    setup = "\n".join(_SETUP.findall(text))
    return setup, _BLOCK.findall(_SETUP.sub("", text))


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup, blocks = _blocks(page)
    (tmp_path / "cli").mkdir()
    monkeypatch.chdir(tmp_path / "cli")
    exec(compile(setup, f"{page}:setup", "exec"), {"__name__": f"docs_{page}"})
    (tmp_path / "python").mkdir()
    monkeypatch.chdir(tmp_path / "python")
    namespace: dict[str, object] = {"__name__": f"docs_{page}"}
    exec(compile(setup, f"{page}:setup", "exec"), namespace)
    ran = []
    for kind, code in blocks:
        if kind == "python":
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, page, "exec"), namespace)
            shown = shown_output(code)  # what the page shows it prints, line for line
            assert shown is None or printed.getvalue().splitlines() == shown, (page, code[:80])
            continue
        for line in code.replace("\\\n", " ").splitlines():  # continued lines joined
            words = shlex.split(line.split("#")[0])
            paths = [w for w in words[2:] if not w.startswith("-")]
            reads = paths[:-1] if words[1:2] == ["convert"] else paths
            if words[:1] != ["torchgraft"] or not all((tmp_path / "cli" / w).exists()
                                                      for w in reads):
                continue  # needs files or a model module the page does not make
            result = subprocess.run([sys.executable, "-m", "torchgraft", *words[1:]],
                                    capture_output=True, text=True, timeout=120,
                                    cwd=tmp_path / "cli", env={**os.environ, "COLUMNS": "100"})
            expected = 2 if page == "safety.md" else 0
            assert result.returncode == expected, (line, result.stdout, result.stderr)
            ran.append(line)
    assert ran or page in NO_CLI_RUN, "no command line of the page ran"


def test_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (it is in the test extra)")
    result = subprocess.run([mkdocs, "build", "--strict", "--quiet", "--site-dir",
                             str(tmp_path / "site")], cwd=DOCS.parent, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "new-head" / "index.html").exists()
