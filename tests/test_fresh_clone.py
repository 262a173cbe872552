"""The README's first command, ``bash scripts/demo.sh``, in a fresh clone of this repository.

Bounded for CI: the clone (``git clone`` of this checkout's commit, into a temporary folder)
reuses the virtual environment running the tests (``TORCHGRAFT_VENV``) with the clone's own
sources first (``PYTHONPATH=<clone>/src``), so setup finds everything importable and installs
nothing (scripts/installed.py); then the demo runs from the clone and every graft of its tour
passes. The README's second command, ``bash scripts/test.sh``, is what CI itself runs
(``.ci/run``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_command_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    cloned = subprocess.run([git, "clone", "--quiet", str(ROOT), str(clone)],
                            capture_output=True, text=True, timeout=120)
    assert cloned.returncode == 0, cloned.stderr
    kept = tmp_path / "tour"
    env = {**os.environ, "TORCHGRAFT_VENV": sys.prefix, "PYTHONPATH": str(clone / "src"),
           "COLUMNS": "100"}
    result = subprocess.run(["bash", "scripts/demo.sh", "--json", "--keep", str(kept)],
                            cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already importable" in result.stderr  # nothing installed, the venv left as it was
    data = json.loads(result.stdout)
    assert len(data["inspect"]) == 10 and all(step["passed"] for step in data["graft"])
    assert (kept / "mymodels.py").is_file()
    where = subprocess.run([f"{sys.prefix}/bin/python", "-c",
                            "import torchgraft; print(torchgraft.__file__)"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(clone)  # the clone's code ran
