"""Coverage-guided fuzzing of every reader, short: the CI's bounded run of the long one.

``scripts/fuzz_readers.py --format all-in-one`` fuzzes every registered format's seed in one
process (an input's first byte picks the target), and the other structure files of the folder
formats and newer readers (a DCP data file, a DeepSpeed rank file and ``latest``, an MLX
folder's ``config.json`` and shard, an Orbax ``_METADATA``, a pipeline's module config), under
``RLIMIT_AS`` and ``RLIMIT_CPU``;
every input must load with ``meta()`` agreeing with ``get()``, or raise a library error.
The long run (>= 10,000 inputs per format, one process each) is the same script without
``--format``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

ROOT = Path(__file__).parent.parent
RUNS = 300


@pytest.mark.slow
def test_fuzzed_inputs_load_or_raise_library_errors(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fuzz_readers.py"), "--format", "all-in-one",
         "--runs", str(RUNS), "--out", str(tmp_path), "--cpu-seconds", "240",
         "--memory-mib", "2048"], capture_output=True, text=True, timeout=300, check=False)
    (report,) = json.loads((tmp_path / "report.json").read_text())
    assert report["inputs"] >= RUNS, (report, done.stdout[-2000:], done.stderr[-2000:])
    assert report["raw"] == 0, report["examples"]
    assert not report["libfuzzer"] and done.returncode == 0, (report, done.stdout[-2000:])
