"""No function in ``graft/`` (sub-packages too) is worse than radon's grade C (complexity > 20)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

from torchgraft.graft import api

GRAFT = Path(api.__file__).parent


def _worse_than_c(paths: list[Path]) -> list[str]:
    return [f"{path.parent.name}/{path.name}:{block.lineno} {block.name} "
            f"({cc_rank(block.complexity)}, {block.complexity})"
            for path in paths for block in cc_visit(path.read_text(encoding="utf-8"))
            if cc_rank(block.complexity) > "C"]


def _sources() -> list[Path]:
    return sorted(GRAFT.rglob("*.py"))


def test_no_function_in_graft_is_worse_than_grade_c() -> None:
    worse = _worse_than_c(_sources())
    assert not worse, "split these into smaller functions: " + "; ".join(worse)


def test_the_guard_reads_every_stage() -> None:
    """A layout change must not take files out of the guard: every sub-package is read."""
    read = {path.parent.name for path in _sources()}
    stages = {path.name for path in GRAFT.iterdir() if (path / "__init__.py").is_file()}
    assert stages and stages <= read, f"not read: {sorted(stages - read)}"


def test_a_function_of_grade_d_is_caught(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {k}:\n        return {k}\n" for k in range(22))
    (tmp_path / "tangled.py").write_text(f"def tangled(x):\n{branches}    return -1\n")
    worse = _worse_than_c([tmp_path / "tangled.py"])
    assert worse == [f"{tmp_path.name}/tangled.py:1 tangled (D, 23)"]
