"""``tune.budget_minutes``: the search on valid, then the chosen settings trained as the run, in one command (on
every rank under torchrun): recsys/tune/search.py's trials one after another on all the ranks, or with
``tune.parallel_trials`` recsys/tune/per_rank.py's, one per rank at once."""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from recsys.config import Config, with_values
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.job.assemble import prepare_dataset_on_rank0
from recsys.job.run_stage import fits_kept_between_trainings
from recsys.rundir.dir import RESULTS_FILE
from recsys.tune.per_rank import Coordination, search_per_rank
from recsys.tune.search import TrainTrial, chosen_config, from_rank0, one_process, search
from recsys.tune.space import describe
from recsys.tune.trials_table import TUNE_DIR, write_trials

log = logging.getLogger(__name__)


def tune_and_fit(
    cfg: Config, run_dir: Path, fit: Callable, train_trial: TrainTrial, record: dict | None = None
) -> dict:
    """The search, then ``fit`` of the chosen config in ``run_dir`` (with ``record``, the run's .hydra/ files, its
    config.yaml the one trained); the trials' table into ``run_dir/tune/``. Under torchrun, on every rank: one
    process group for the trials and the run (module docstring)."""
    env = init_distributed(cfg.sharding.device, cfg.sharding.backend) if _world_size() > 1 else None
    comm = None
    try:
        if env is None:
            if cfg.tune.parallel_trials:
                log.info("tune.parallel_trials: one process, so its trials run one after another")
            run_search = functools.partial(search, sync=one_process)
        elif cfg.tune.parallel_trials:
            prepare_dataset_on_rank0(cfg.data, env)  # once, before the ranks' trials would each prepare it
            comm = Coordination(env, 60.0 * float(cfg.tune.budget_minutes))
            run_search = functools.partial(search_per_rank, comm=comm)
        else:
            run_search = functools.partial(search, sync=from_rank0)
        return _tune_and_fit(cfg, run_dir, fit, train_trial, record, run_search)
    finally:
        if comm is not None:
            comm.close()
        if env is not None:
            destroy_distributed(env)


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _tune_and_fit(cfg, run_dir: Path, fit: Callable, train_trial: TrainTrial, record, run_search: Callable) -> dict:
    done = run_dir / TUNE_DIR / "trials.json"
    if done.is_file() and (run_dir / RESULTS_FILE).is_file():  # searched and trained: reported, not searched again
        values = json.loads(done.read_text()).get("values") or {}
        return fit(with_values(cfg, values), run_dir, record)
    log.info("tune: %g minutes on valid %s over %s", cfg.tune.budget_minutes, cfg.eval.valid_metric,
             "; ".join(describe(k) for k in cfg.tune.space))  # fmt: skip
    began = time.monotonic()
    with fits_kept_between_trainings():  # the graph filter's (EASE's) fit made once for every trial's figure
        trials = run_search(cfg, run_dir, train_trial)
    final, best, why = chosen_config(cfg, trials)
    summary = {
        "metric": cfg.eval.valid_metric,
        "budget_minutes": cfg.tune.budget_minutes,
        "seconds": time.monotonic() - began,
        "chosen": None if best is None else best.number,
        "why": why,
        "values": None if best is None else best.values,
    }
    if int(os.environ.get("RANK", "0")) == 0:
        write_trials(run_dir, trials, summary)
    if best is not None:
        log.info("tune: %s (valid %.4f): %s", why, best.valid, best.values)
    else:
        log.warning("tune: %s", why)
    if record is not None:
        record = {**record, "config.yaml": OmegaConf.to_yaml(OmegaConf.structured(final))}
    return fit(final, run_dir, record)
