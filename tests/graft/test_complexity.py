"""No function in ``graft/`` is worse than radon's grade C (cyclomatic complexity over 20)."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_rank, cc_visit

from torchgraft.graft import plan

GRAFT = Path(plan.__file__).parent


def _worse_than_c(paths: list[Path]) -> list[str]:
    return [f"{path.name}:{block.lineno} {block.name} ({cc_rank(block.complexity)}, "
            f"{block.complexity})"
            for path in paths for block in cc_visit(path.read_text(encoding="utf-8"))
            if cc_rank(block.complexity) > "C"]


def test_no_function_in_graft_is_worse_than_grade_c() -> None:
    worse = _worse_than_c(sorted(GRAFT.glob("*.py")))
    assert not worse, "split these into smaller functions: " + "; ".join(worse)


def test_a_function_of_grade_d_is_caught(tmp_path: Path) -> None:
    branches = "".join(f"    if x == {k}:\n        return {k}\n" for k in range(22))
    (tmp_path / "tangled.py").write_text(f"def tangled(x):\n{branches}    return -1\n")
    assert _worse_than_c([tmp_path / "tangled.py"]) == ["tangled.py:1 tangled (D, 23)"]
