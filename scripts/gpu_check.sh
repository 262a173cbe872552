#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run on a machine with one (CI has none): the tests
# that skip without a GPU (device maps, pinned staging, grafts into a model on the device) and
# bench/gpu.py. Logs go to the folder given (default: the current one).
#
#   bash scripts/gpu_check.sh [LOG_FOLDER]
set -uo pipefail
logs=${1:-.}
mkdir -p "$logs"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name())" \
  || exit 1
python3 -m pytest -q -p no:cacheprovider tests/test_devices.py tests/io/test_staging.py \
  tests/graft/test_devices.py tests/graft/test_graft.py 2>&1 | tee "$logs/gpu_tests.log"
tests=${PIPESTATUS[0]}
python3 bench/gpu.py --repeat 5 2>&1 | tee "$logs/gpu_bench.log"
exit "$tests"
