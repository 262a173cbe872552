"""Print the real code-base pairs suite's table: pair x flavour -> verdict, outputs equal.

Usage: ``PYTHONPATH=src python scripts/pairs_table.py [--heldout]`` from the repository root
(the code bases come from ``scripts/setup.sh test``). ``--heldout``: the held-out suite (code
bases none of torchgraft's name tables lists, issue 27) instead of the real-pairs suite;
``--v5``: issue 37's held-out pairs (``tests/graft/pairs/heldout_v5.py``). Broken
twins are listed after the pairs; a twin's outputs never equal the source's, so any ``ok``
there is a false ok.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.graft.pairs import expectations, heldout_expectations, heldout_v5_expectations
from tests.graft.pairs.pairs import PAIRS, Outcome, Pair, case_key, cases, graft_case

#: One case: its row (the pair), its column (flavour, or twin/flavour), and how to run it.
Case = tuple[str, str, Callable[[], Outcome]]


def _pair_cases(pairs: list[Pair]) -> Iterator[Case]:
    for pair, flavour, twin in cases(pairs):
        def run(pair: Pair = pair, flavour: str = flavour, twin: str | None = twin) -> Outcome:
            with tempfile.TemporaryDirectory() as folder:
                return graft_case(pair, flavour, Path(folder), twin=twin)

        yield (*case_key(pair, flavour, twin), run)


def _heldout_cases() -> Iterator[Case]:
    """The held-out pairs, then MLX's file (one way) into each of its targets, with twins."""
    from tests.graft.pairs import heldout_mlx as mlx
    from tests.graft.pairs.heldout import HELDOUT_PAIRS

    def run(target: str, twin: str | None) -> Outcome:
        with tempfile.TemporaryDirectory() as folder:
            return mlx.graft_mlx(target, twin, Path(folder))

    yield from _pair_cases(HELDOUT_PAIRS)
    for target in mlx.TARGETS:
        for twin in mlx.FILES:
            column = mlx.FLAVOUR if twin is None else f"{twin}/{mlx.FLAVOUR}"
            yield (f"{mlx.SOURCE} -> {target}", column,
                   lambda target=target, twin=twin: run(target, twin))


def main() -> int:
    """Run every case of the chosen suite and print one row per pair."""
    suite: Iterator[Case]
    expected: ModuleType
    if "--heldout" in sys.argv[1:]:
        suite, expected = _heldout_cases(), heldout_expectations
    elif "--v5" in sys.argv[1:]:
        from tests.graft.pairs.heldout_v5 import V5_PAIRS

        suite, expected = _pair_cases(V5_PAIRS), heldout_v5_expectations
    else:
        suite, expected = _pair_cases(PAIRS), expectations
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    false_ok = 0
    start = time.perf_counter()
    for name, column, run in suite:
        try:
            outcome = run()
            cell = outcome.row()
            false_ok += outcome.verdict == "ok" and not outcome.equal
        except Exception as exc:  # a case that fails outright is shown, not hidden
            cell = f"error: {type(exc).__name__}"
        marks = ("x" if (name, column) in expected.NOT_YET else "") + \
                ("u" if (name, column) in expected.UNDECIDABLE else "")
        rows.setdefault(name, {})[column] = cell + (f" ({marks})" if marks else "")
        if column not in columns:
            columns.append(column)
    print("| pair | " + " | ".join(columns) + " |")
    print("|" + "---|" * (len(columns) + 1))
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells.get(c, "") for c in columns) + " |")
    print(f"\n{false_ok} false ok; (x) marked not yet, (u) undecidable; "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
