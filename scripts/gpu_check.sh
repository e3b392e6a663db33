#!/usr/bin/env bash
# One GPU's whole story in at most 8 minutes (the steps' timeouts add up to 470 s), ending with ONE JSON line:
# the GPU tests, the synthetic default's samples/s at global batch 8192, 32768 and 131072, +experiment=gowalla end
# to end, bench_train's three ways, bench_eval's ratio, bench_loss at 131072, bench_loader on the GPU, peak device
# memory. A failing step is recorded in the JSON and the next one runs. What each step runs: scripts/gpu_check.py.
#   $ bash scripts/gpu_check.sh                         (PY defaults to .venv/bin/python: make setup FBGEMM=cuda TORCH=system)
#   $ bash .gpu/b/stage2.sh bash scripts/gpu_check.sh   (a GPU machine without package access: ../shared/gpu/prepare.sh)
# Work files go to $GPU_CHECK_DIR (default /tmp/recsys_gpu_check); with $OUT set, the JSON, gowalla's results.json
# and an archive of the logs are copied there. Exit status 0 when every step that exists passed.
cd "$(dirname "$0")/.." || exit 1
exec "${PYTHON:-python3}" scripts/gpu_check.py
