"""The package's imports run one way and never in a circle, kept by import-linter's contracts.

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``); ``scripts/test.sh`` runs
``lint-imports`` on the tree. Here the same contracts run on copies of the package with one
import added that breaks them: an upward import between graft's stages, and a circle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def _lint(tree: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on a tree holding ``pyproject.toml`` and ``src/torchgraft``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    chosen = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run([str(LINT), "--no-cache", *chosen], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src" / "torchgraft", tmp_path / "src" / "torchgraft",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _add_import(tree: Path, module: str, line: str) -> None:
    path = tree / "src" / Path(*module.split(".")).with_suffix(".py")
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")


def test_the_package_keeps_every_contract() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    # an upward import between graft's stages
    ("torchgraft.graft.layouts.ops", "from ..plan import steps as _steps", "stages"),
    # a circle inside one package
    ("torchgraft.graft.layouts.bare", "from . import fusion as _fusion", "acyclic"),
    # graft imported from the readers
    ("torchgraft.io.paddle_layout", "from ..graft import tensors as _tensors", "below-graft"),
], ids=["upward", "cycle", "readers"])
def test_an_import_against_a_contract_is_refused(tmp_path: Path, module: str, line: str,
                                                 contract: str) -> None:
    tree = _copy(tmp_path)
    assert _lint(tree, contract).returncode == 0  # the copy keeps it
    _add_import(tree, module, line)
    result = _lint(tree, contract)
    assert result.returncode == 1 and "BROKEN" in result.stdout, result.stdout
