#!/usr/bin/env bash
# GPU check, under 8 minutes on one GPU (the timeouts add up to 7.9): the GPU-marked tests, a short
# throughput run, then bench_train (three ways) and bench_eval on the GPU.
#   $ bash scripts/gpu_check.sh            (uses .venv, created with `make setup FBGEMM=cuda`)
# Prints a summary; exit status non-zero if a test or the run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-/tmp/recsys_gpu_check}
mkdir -p "$OUT"
nvidia-smi -L || { echo "gpu_check: no GPU visible"; exit 1; }
"$PY" -c "import torch, fbgemm_gpu, torchrec; assert torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

timeout 240 "$PY" -m pytest -q -m gpu tests/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

# Throughput at the MovieLens-1M shape (the default synthetic dataset), 1 epoch, sparse-dist pipeline.
# resume=none: a rerun must train again, not report the previous run's figures.
timeout 100 "$PY" -m recsys.train sharding.device=cuda trainer.pipeline=sparse_dist trainer.epochs=1 trainer.resume=none \
    trainer.global_batch_size=8192 trainer.progress_bar=false run_name=gpu_check hydra.run.dir="$OUT/run" 2>&1 | tail -8
run_rc=${PIPESTATUS[0]}
samples=$("$PY" -c "import json; print(round(json.load(open('$OUT/run/results.json'))['train']['samples_per_s']))" 2>/dev/null || echo "n/a")

# The three-way training bench on this GPU at the MovieLens shape (samples/s per GPU, ratios).
timeout 90 "$PY" scripts/bench_train.py --shape movielens --device cuda --rounds 3 --steps 20 --warmup 10 2>&1 \
    | tee "$OUT/bench_train.log" | tail -3
bench_line=$(tail -1 "$OUT/bench_train.log")

# Exact top-100 at the ML-20M shape on the GPU vs. its bare matmuls (issue: offline evaluation speed).
timeout 45 "$PY" scripts/bench_eval.py --device cuda 2>&1 | tee "$OUT/bench_eval.log" | tail -4
eval_line=$(tail -1 "$OUT/bench_eval.log")

echo "== gpu_check summary =="
echo "gpu tests: $( [ $tests_rc -eq 0 ] && echo passed || echo "FAILED (rc $tests_rc)" ) — $(tail -1 "$OUT/gpu_tests.log")"
echo "throughput run: $( [ $run_rc -eq 0 ] && echo ok || echo "FAILED (rc $run_rc)" ), train samples/s per GPU: $samples"
echo "bench_train (cuda, movielens shape): $bench_line"
echo "bench_eval (cuda): $eval_line"
[ $tests_rc -eq 0 ] && [ $run_rc -eq 0 ]
