#!/usr/bin/env bash
# GPU check, under 8 minutes on one GPU (the timeouts add up to 7.8): the GPU-marked tests, a short
# throughput run, then bench_train (three ways) and bench_eval on the GPU.
#   $ bash scripts/gpu_check.sh            (uses .venv, created with `make setup FBGEMM=cuda`)
# Prints a summary; exit status non-zero if the stack, a test or the run failed. Work files go to
# $GPU_CHECK_DIR (default /tmp/recsys_gpu_check); when $OUT is set (a machine that returns the
# files under $OUT), the logs and results.json are copied there at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WORK=${GPU_CHECK_DIR:-/tmp/recsys_gpu_check}
mkdir -p "$WORK"
timeout 20 nvidia-smi -L || { echo "gpu_check: no GPU visible"; exit 1; }
# A broken stack would make every later step fail slowly: stop here instead.
timeout 40 "$PY" -c "import torch, fbgemm_gpu, torchrec; assert torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" \
    || { echo "gpu_check: torch / fbgemm_gpu / torchrec do not import with CUDA from $PY"; exit 1; }

timeout 260 "$PY" -m pytest -v --durations=0 -m gpu tests/test_gpu.py 2>&1 | tee "$WORK/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

# Throughput at the MovieLens-1M shape (the default synthetic dataset), sparse-dist pipeline. Two
# epochs: the figure is the last logged window of the second, past tracing and kernel loading.
# resume=none and a fresh dir: a rerun must train again, not report the previous run's figures.
rm -rf "$WORK/run"
timeout 60 "$PY" -m recsys.train sharding.device=cuda trainer.pipeline=sparse_dist trainer.epochs=2 trainer.resume=none \
    trainer.early_stopping_patience=0 trainer.log_every_steps=20 trainer.global_batch_size=8192 trainer.progress_bar=false \
    run_name=gpu_check hydra.run.dir="$WORK/run" 2>&1 | tail -8
run_rc=${PIPESTATUS[0]}
samples=$("$PY" -c "
import json
rows = [r for r in map(json.loads, open('$WORK/run/metrics.jsonl')) if 'samples_per_s' in r]
assert rows[-1]['epoch'] == 1, 'no window logged in the second epoch (epochs count from 0)'
print(round(rows[-1]['samples_per_s']))" 2>/dev/null || echo "n/a")

# The three-way training bench on this GPU at the MovieLens shape (samples/s per GPU, ratios).
timeout 60 "$PY" scripts/bench_train.py --shape movielens --device cuda --rounds 3 --steps 20 --warmup 10 2>&1 \
    | tee "$WORK/bench_train.log" | tail -3
bench_line=$(grep '^{' "$WORK/bench_train.log" | tail -1)

# Exact top-100 at the ML-20M shape on the GPU vs. its bare matmuls (issue: offline evaluation speed).
timeout 30 "$PY" scripts/bench_eval.py --device cuda 2>&1 | tee "$WORK/bench_eval.log" | tail -4
eval_line=$(grep '^{' "$WORK/bench_eval.log" | tail -1)

summary="== gpu_check summary ==
gpu tests: $( [ $tests_rc -eq 0 ] && echo passed || echo "FAILED (rc $tests_rc)" ) — $(tail -1 "$WORK/gpu_tests.log")
throughput run: $( [ $run_rc -eq 0 ] && echo ok || echo "FAILED (rc $run_rc)" ), train samples/s per GPU (epoch 2, last window): $samples
bench_train (cuda, movielens shape): ${bench_line:-n/a}
bench_eval (cuda): ${eval_line:-n/a}"
echo "$summary" | tee "$WORK/summary.txt"
if [ -n "${OUT:-}" ] && [ "$OUT" != "$WORK" ]; then
    mkdir -p "$OUT" && cp "$WORK"/*.log "$WORK/summary.txt" "$OUT"/ && cp "$WORK/run/results.json" "$OUT"/ 2>/dev/null
fi
[ $tests_rc -eq 0 ] && [ $run_rc -eq 0 ]
