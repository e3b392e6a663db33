"""Load a training checkpoint on this job's ranks (any number, any plan) and save it again.

    $ torchrun --standalone --nproc_per_node=3 tests/helpers/reload_checkpoint.py CKPT OUT [overrides...]

:func:`reload_checkpoint` does the same in a process that has joined its group already (the tests' one-process group).
"""

import sys
from collections.abc import Sequence
from pathlib import Path

from data_pipelines.prepare import prepare_dataset
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.sharding import shard_model
from recsys.job.assemble import open_dataset
from recsys.rundir.checkpoint import load_checkpoint, save_checkpoint
from tests.helpers.config import tiny_config
from tests.helpers.run_task import run_task


def reload_checkpoint(ckpt: Path, out: Path, overrides: Sequence[str], env: DistEnv) -> None:
    cfg = tiny_config(overrides)
    data = open_dataset(cfg, prepare_dataset(cfg.data))
    sharded = shard_model(
        run_task(cfg, data),
        sharding=cfg.sharding,
        sparse=cfg.optim.sparse,
        dense=cfg.optim.dense,
        env=env,
        seed=cfg.trainer.seed + 1,
    )  # other init: load must overwrite it
    state = load_checkpoint(sharded, ckpt, env=env)
    save_checkpoint(sharded, state, root=out, env=env)
    del sharded


def main() -> None:
    env = init_distributed("cpu", "gloo")
    reload_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:], env)
    destroy_distributed(env)


if __name__ == "__main__":
    main()
