from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

CONSOLE_SCRIPT = Path(sys.executable).with_name("torchgraft")


@pytest.fixture
def run() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the CLI through ``python -m torchgraft``, as a user would."""

    def _run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "torchgraft", *args], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    return _run
