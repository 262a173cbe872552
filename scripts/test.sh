#!/usr/bin/env bash
# Set up .venv with the test extra (see setup.sh), then lint, type-check, check the import
# layers (import-linter, [tool.importlinter] in pyproject.toml) and run all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
BIN="${TORCHGRAFT_VENV:-.venv}/bin"
"$BIN/ruff" check src tests bench scripts
"$BIN/mypy"
"$BIN/lint-imports" --no-cache
exec "$BIN/python" -m pytest "$@"
