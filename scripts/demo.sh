#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the demo: every seed scenario written and opened.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${TORCHGRAFT_VENV:-.venv}/bin/torchgraft" demo "$@"
