"""Evaluate a trained run: exact full-corpus top-K, baselines (popularity, EASE, iALS), FAISS, a report.

    $ python -m recsys.evaluate run_dir=runs/default
    $ torchrun --standalone --nproc_per_node=2 -m recsys.evaluate run_dir=runs/default   # users split over ranks
    $ python scripts/evaluate_recall.py run_dir=runs/tiny ks=[10,20,50,100] ann_kinds=[]

Loads the checkpoint's config (its ``config.yaml``; older runs: ``<run_dir>/.hydra/config.yaml``)
and its best-epoch weights (any number of processes may have saved them; they are resharded for
this job), embeds every item and the valid / test users on all ranks, and writes
``<run_dir>/eval/`` (``out_dir=...``; a sample of users, ``max_users=N``, goes to
``<run_dir>/eval_sample_<N>_seed_<seed>/``): report.json, report.md, recall_at_k.png,
recommendations.parquet. Rank 0 reads the whole dataset (the report needs every user); every
other rank reads only its own range of users, whose queries it embeds.
"""

from __future__ import annotations

from recsys.utils.cpu_memory import log_cpu_allocator, tune_cpu_allocator

# run as a program, not imported: set before anything imports torch, which reads THP_MEM_ALLOC_ENABLE
# at its first allocation
CPU_ALLOCATOR_SETTINGS = tune_cpu_allocator() if __name__ == "__main__" else []

import logging
import os

import hydra
from omegaconf import DictConfig
from torch.distributed.elastic.multiprocessing.errors import record

from recsys.config import EvaluateConfig, register_configs, to_typed
from recsys.job.entry import refusals
from recsys.job.trained import evaluate_run
from recsys.utils.logs import setup_logging

__all__ = ["EvaluateConfig", "evaluate_run", "main"]


@record
@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    setup_logging(int(os.environ.get("RANK", "0")))  # console: recsys's lines; library chatter: the log file, rank 0
    log_cpu_allocator(logging.getLogger(__name__), CPU_ALLOCATOR_SETTINGS)
    with refusals():  # a refusal: one line on stderr, exit 1 (recsys/utils/refusals.py)
        evaluate_run(to_typed(cfg, EvaluateConfig))


if __name__ == "__main__":
    register_configs()
    main()
