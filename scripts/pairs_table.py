"""Print the real code-base pairs suite's table: pair x flavour -> verdict, outputs equal.

Usage: ``PYTHONPATH=src python scripts/pairs_table.py [--markdown]`` from the repository root
(the code bases come from ``scripts/setup.sh test``). Broken twins are listed after the pairs;
a twin's outputs never equal the source's, so any ``ok`` there is a false ok.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.graft.pairs.expectations import NOT_YET, UNDECIDABLE
from tests.graft.pairs.pairs import case_key, cases, graft_case


def main() -> int:
    """Run every case and print one row per pair."""
    rows: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    false_ok = 0
    start = time.perf_counter()
    for pair, flavour, twin in cases():
        name, column = case_key(pair, flavour, twin)
        with tempfile.TemporaryDirectory() as folder:
            try:
                outcome = graft_case(pair, flavour, Path(folder), twin=twin)
                cell = outcome.row()
                false_ok += outcome.verdict == "ok" and not outcome.equal
            except Exception as exc:  # a case that fails outright is shown, not hidden
                cell = f"error: {type(exc).__name__}"
        marks = ("x" if (name, column) in NOT_YET else "") + \
                ("u" if (name, column) in UNDECIDABLE else "")
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
