"""Load a training checkpoint on this job's ranks (any number, any plan) and save it again.

    $ torchrun --standalone --nproc_per_node=3 tests/helpers/reload_checkpoint.py CKPT OUT [overrides...]
"""

import sys
from pathlib import Path

from recsys.checkpoint import load_checkpoint, save_checkpoint
from recsys.data.dataset import load_dataset
from data_pipelines.prepare import prepare_dataset
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.distributed.sharding import shard_model
from recsys.model.build import build_task
from tests.conftest import tiny_config


def main() -> None:
    ckpt, out, overrides = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    cfg = tiny_config(overrides)
    env = init_distributed("cpu", "gloo")
    data = load_dataset(prepare_dataset(cfg.data))
    sharded = shard_model(build_task(cfg, data), sharding=cfg.sharding, sparse=cfg.optim.sparse,
                          dense=cfg.optim.dense, env=env, seed=cfg.trainer.seed + 1)  # other init: load must overwrite it
    state = load_checkpoint(sharded, ckpt, env=env)
    save_checkpoint(sharded, state, root=out, env=env)
    del sharded
    destroy_distributed(env)


if __name__ == "__main__":
    main()
