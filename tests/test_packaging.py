"""Packaging: the wheel builds, carries its license and one version."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import torchgraft as tg

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_builds_with_license_version_and_typing(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("torchgraft-*.whl")
    assert wheel.name.startswith(f"torchgraft-{tg.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert "torchgraft/py.typed" in names
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("METADATA"))).decode()
    assert f"Version: {tg.__version__}" in metadata
    assert "Programming Language :: Python :: 3.13" in metadata
