"""Which code bases the pair suites need: a suite skips whole where one is not installed."""

from __future__ import annotations

import importlib.util

import pytest


def skip_without_code_bases(*names: str) -> None:
    """Skip the calling test module unless every package named is installed.

    Called at module level, before the module imports the code bases' builders.
    """
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"code bases not installed: {', '.join(missing)} (scripts/setup.sh installs "
                    "them)", allow_module_level=True)
