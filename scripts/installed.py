"""Exit 0 when this checkout's torchgraft and an extra's requirements are already importable.

``scripts/setup.sh`` then skips ``pip install -e``: a venv that already runs this checkout (an
editable install of it, or ``PYTHONPATH=src``) with every requirement present needs nothing,
and a fresh clone can reuse a prepared venv (``TORCHGRAFT_VENV``) without re-pointing it.

    python scripts/installed.py [EXTRA]
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _requirements(extra: str) -> list[str] | None:
    try:
        import tomllib
    except ImportError:  # Python 3.10: no TOML reader; install as usual
        return None
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    if extra and extra not in extras:
        return None
    return [*project.get("dependencies", []), *(extras.get(extra, []) if extra else [])]


def main() -> int:
    """0 when nothing needs installing, 1 otherwise."""
    try:
        import torchgraft
    except ImportError:
        return 1
    if Path(torchgraft.__file__).resolve().parents[1] != ROOT / "src":
        return 1  # another checkout's torchgraft
    requirements = _requirements(sys.argv[1] if len(sys.argv) > 1 else "")
    if requirements is None:
        return 1
    for requirement in requirements:
        name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
