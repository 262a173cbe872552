#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one device call of at most 9 minutes (CI has no GPU):
# the tests that skip without one (device maps, the pinned staging ring, grafts and tg.load
# onto the device, adaptations run there), then bench/gpu.py (issue 34: tg against
# load_file(device=...), runai-model-streamer and fastsafetensors, warm and cold, the read and
# bus limits, end to end against from_pretrained). Logs go to the folder given (default: the
# current one); the bench's inputs (about 13 GB) are written under .bench/ in the checkout.
#
#   bash scripts/gpu_check.sh [LOG_FOLDER]
#
# runai-model-streamer and fastsafetensors are not in the device's image: carry their wheels
# (.whl/, see the report of issue 34 for the command) and put them on PYTHONPATH first.
set -uo pipefail
logs=${1:-.}
mkdir -p "$logs" .bench
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name())" \
  || exit 1
nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max,memory.total --format=csv \
  | tee "$logs/gpu_info.log"
findmnt -T .bench | tee -a "$logs/gpu_info.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -x tests/test_devices.py \
  tests/io/test_staging.py tests/io/test_reads.py tests/graft/test_devices.py \
  tests/graft/test_graft.py 2>&1 | tee "$logs/gpu_tests.log"
tests=${PIPESTATUS[0]}
# rounds interleave every method (warm folder, end to end, warm file, then cold); no run
# starts after --budget seconds of the bench, each result is logged as it comes
timeout 390 python3 bench/gpu.py --device cuda --size-gib 4 --rounds 3 --cold-rounds 2 \
  --budget 300 --dir .bench 2>&1 | tee "$logs/gpu_bench.log"
bench=${PIPESTATUS[0]}
rm -rf .bench
exit $(( tests || bench ))
