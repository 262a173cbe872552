#!/usr/bin/env bash
# Set up .venv (see setup.sh) and run the demo: a guided tour of fourteen checkpoint problems.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${TORCHGRAFT_VENV:-.venv}/bin/torchgraft" demo "$@"
