"""Start-up time of the command line: ``torchgraft --help`` and ``--version``.

Before the commands were imported lazily, every start imported torch (2-3 s on a 2-core
machine); this compares each command line with ``python -c "import torch"``, the cost it no
longer pays. Median of several fresh processes each (the interpreter's files are warm after
the first run, which is discarded).

    python bench/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _median_seconds(command: list[str], runs: int) -> float:
    times = []
    for k in range(runs + 1):
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        if k:  # the first run warms the page cache
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Print one line per command line timed."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    cli = [sys.executable, "-m", "torchgraft"]
    cases = {"torchgraft --help": [*cli, "--help"], "torchgraft --version": [*cli, "--version"],
             "python -c 'import torch' (the old floor)": [sys.executable, "-c", "import torch"]}
    for label, command in cases.items():
        print(f"{label:<42} {_median_seconds(command, args.runs):.3f} s "
              f"(median of {args.runs})")


if __name__ == "__main__":
    main()
