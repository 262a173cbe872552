#!/usr/bin/env bash
# Create .venv and install torchgraft into it, with optional extras: scripts/setup.sh [test|paddle|hf|onnx]
# torch is installed first, as TORCH_SPEC (default torch==2.13.0, a CPU build), unless the venv
# can already import it: an unpinned torch would pull several GB of CUDA packages. torchgraft
# itself is installed unless this checkout's is already importable with the extra's
# requirements (scripts/installed.py): a fresh clone can reuse a venv with PYTHONPATH=src.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${TORCHGRAFT_VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${1:-}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "is ignored" || true; }
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: installing $TORCH_SPEC" >&2
    pip_install "$TORCH_SPEC"
fi
if "$PY" scripts/installed.py "$EXTRAS" >/dev/null 2>&1; then
    echo "setup: this checkout's torchgraft${EXTRAS:+[$EXTRAS]} is already importable in $VENV" >&2
else
    echo "setup: installing torchgraft${EXTRAS:+[$EXTRAS]}" >&2
    pip_install -e ".${EXTRAS:+[$EXTRAS]}"
fi
if [ "$EXTRAS" = "test" ]; then
    # Code bases that depend on torch/torchvision: without their dependencies (see the file).
    pip_install --no-deps -r scripts/requirements-no-deps.txt
fi
"$PY" -c "import torch, torchgraft" || { echo "setup: install failed" >&2; exit 1; }
