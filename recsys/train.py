"""Train a two-tower retrieval model and report test recall.

    $ python -m recsys.train                                     # default synthetic dataset, 1 process
    $ python -m recsys.train +experiment=tiny trainer.epochs=2   # any config value from the command line
    $ torchrun --standalone --nproc_per_node=2 -m recsys.train   # 2 processes (GPUs if visible, else CPU/gloo)
    $ python -m recsys.train +experiment=movielens tune.budget_minutes=20   # search on valid, then train the best

Outputs land in runs/<run_name>/ (results.json, metrics.jsonl, tb/, train.log). On SIGTERM it checkpoints
and exits with status 75, on Ctrl-C with 130 (recsys/rundir/preemption.py); the same command resumes.
"""

from __future__ import annotations

from recsys.utils.cpu_memory import log_cpu_allocator, tune_cpu_allocator

# run as a program, not imported: set before anything imports torch, which reads THP_MEM_ALLOC_ENABLE
# at its first allocation
CPU_ALLOCATOR_SETTINGS = tune_cpu_allocator() if __name__ == "__main__" else []

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from recsys.config import refuse_moved_keys, register_configs, to_config
from recsys.job.entry import refusals
from recsys.job.run import fit, search_trial
from recsys.rundir.preemption import INTERRUPTED_EXIT_CODE, Preempted
from recsys.rundir.record import has_record, write_run_record
from recsys.tune.tuned_run import tune_and_fit
from recsys.utils.logs import setup_logging


def run_record(cfg: DictConfig) -> dict[str, str]:
    """The run's .hydra/ files as Hydra writes them (conf/config.yaml leaves the writing to the run)."""
    hydra_cfg = HydraConfig.get()
    return {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})),
        "overrides.yaml": OmegaConf.to_yaml(hydra_cfg.overrides.task),
    }


@record
@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    setup_logging(int(os.environ.get("RANK", "0")))  # console: recsys's lines; library chatter: the log file, rank 0
    log_cpu_allocator(logging.getLogger(__name__), CPU_ALLOCATOR_SETTINGS)
    if int(os.environ.get("RANK", "0")) != 0:  # one log, from rank 0
        logging.getLogger().setLevel(logging.WARNING)
    run_dir, record_files = Path(HydraConfig.get().runtime.output_dir), run_record(cfg)
    if int(os.environ.get("RANK", "0")) == 0 and not has_record(run_dir):  # a new run dir: nothing to keep
        write_run_record(run_dir, record_files)
    with refusals():  # bad input files, config values, a held run dir...: one line on stderr, exit 1
        try:
            typed = to_config(cfg)
            if typed.tune.budget_minutes is None:
                fit(typed, run_dir, record_files)
            else:  # the budgeted search on valid, then the chosen settings trained (recsys/tune/search.py)
                tune_and_fit(typed, run_dir, fit, search_trial, record_files)
        except Preempted as e:  # SIGTERM / Ctrl-C: checkpointed; a status schedulers can tell from a failure
            print(str(e), file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:  # Ctrl-C outside the training loop (preparing, ranking): nothing to save there
            print(
                "interrupted (Ctrl-C); run the same command again to go on from the run's last checkpoint",
                file=sys.stderr,
            )
            sys.exit(INTERRUPTED_EXIT_CODE)


if __name__ == "__main__":
    register_configs()
    with refusals():  # a key that moved: where it went (Hydra would say only that the schema lacks it)
        refuse_moved_keys(sys.argv[1:])
    main()
