"""Evaluate a trained run: exact full-corpus top-K, baselines (popularity, EASE), FAISS, a report.

    $ python -m recsys.evaluate run_dir=runs/default
    $ torchrun --standalone --nproc_per_node=2 -m recsys.evaluate run_dir=runs/default   # users split over ranks
    $ python scripts/evaluate_recall.py run_dir=runs/tiny ks=[10,20,50,100] ann_kinds=[]

Loads the checkpoint's config (its ``config.yaml``; older runs: ``<run_dir>/.hydra/config.yaml``)
and its best-epoch weights (any number of processes may have saved them; they are resharded for
this job), embeds every item and the
valid / test users on all ranks, and writes ``<run_dir>/eval/`` (``out_dir=...``; a sample of
users, ``max_users=N``, goes to ``<run_dir>/eval_sample_<N>_seed_<seed>/``): report.json, report.md,
recall_at_k.png, recommendations.parquet. Rank 0 reads the whole dataset (the report needs every
user); every other rank reads only its own range of users, whose queries it embeds.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import hydra
import numpy as np
import torch.distributed as dist
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.errors import record

from recsys.checkpoint import CONFIG_FILE, load_checkpoint
from recsys.config import Config, SparseOptimConfig, query_uses_user_id, register_configs, reject_unknown_keys
from recsys.data.batches import FeatureBuilder
from recsys.data.dataset import load_dataset
from recsys.distributed.collectives import all_gather_rows
from recsys.distributed.data_shards import rank_user_range
from recsys.distributed.env import DistEnv, destroy_distributed, init_distributed
from recsys.distributed.sharding import inference_sharding, shard_model
from recsys.evaluation.ann import ANN_KINDS
from recsys.evaluation.ease import DEFAULT_LAMBDAS
from recsys.evaluation.evaluator import PRECEDING_SPLITS, Evaluator, embed
from recsys.evaluation.interactions import UserItemCSR
from recsys.logs import setup_logging
from recsys.evaluation.report import EvalInputs, ReportOptions, SplitInputs, evaluate_and_report
from recsys.trainer import build_task, config_fingerprint, prepare_dataset_on_rank0

log = logging.getLogger(__name__)


@dataclass
class EvaluateConfig:
    run_dir: str = MISSING  # the training run to evaluate (holds .hydra/ and checkpoints/)
    checkpoint: str = ""  # checkpoint dir to load; "" = <run_dir>/checkpoints/best
    ks: List[int] = field(default_factory=lambda: [10, 20, 50, 100])  # cut-offs reported
    splits: List[str] = field(default_factory=lambda: ["valid", "test"])  # evaluated splits (valid tunes EASE)
    ease: bool = True  # EASE baseline (float64, else float32 by the memory free, else skipped with the reason; and up to ease_max_items)
    ease_max_items: int = 50_000  # EASE needs an items x items inverse
    # λ grid tuned on valid; each value is one O(items³) factorisation (~1 min at 8k items, tens of
    # minutes at Gowalla's 41k on 2 CPU cores), so large catalogs may want one or two values
    ease_lambdas: List[float] = field(default_factory=lambda: list(DEFAULT_LAMBDAS))
    ials: bool = True  # iALS baseline (implicit's ALS, tuned on valid like EASE)
    ann_kinds: List[str] = field(default_factory=lambda: list(ANN_KINDS))  # FAISS indexes; [] disables
    max_users: int = 0  # users evaluated per split: 0 = all; N = a uniform sample of N (catalogs of 10^8 users), drawn from seed
    # where the report goes; "" = <run_dir>/eval, or <run_dir>/eval_sample_<max_users>_seed_<seed> for a
    # sample (max_users), so that a sampled report never replaces the full one
    out_dir: str = ""
    seed: int = 0  # seed of the user sample (max_users)
    batch_size: int = 4096  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul
    device: str = "auto"  # "auto" | "cpu" | "cuda"


def report_dir(ecfg: EvaluateConfig, run_dir: Path) -> Path:
    if ecfg.out_dir:
        return Path(ecfg.out_dir)
    # eval/ is report.EVAL_DIR, also this entry point's Hydra run dir (conf/evaluate.yaml)
    return run_dir / (f"eval_sample_{ecfg.max_users}_seed_{ecfg.seed}" if ecfg.max_users else "eval")


def checkpoint_dir(run_dir: Path, checkpoint: str) -> Path:
    return Path(checkpoint) if checkpoint else run_dir / "checkpoints" / "best"


def load_run_config(run_dir: Path, checkpoint: str = "") -> Config:
    """The config the checkpoint's weights were trained with: its own copy (``config.yaml``) when it has
    one, else the run's ``.hydra/config.yaml`` (which a later, refused ``recsys.train`` in the same run
    dir rewrites at start-up)."""
    ckpt = checkpoint_dir(run_dir, checkpoint)
    path = ckpt / CONFIG_FILE
    if not path.is_file():
        path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; is {run_dir} a run dir written by `python -m recsys.train`?")
    schema = OmegaConf.structured(Config)
    cfg = OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(path)))
    # the weights' own record of their data / model config: a config that differs would build another
    # model or split (and report numbers for a protocol the weights never saw)
    from recsys.checkpoint import STATE_FILE, read_trainer_state

    if (ckpt / STATE_FILE).is_file():
        saved, now = read_trainer_state(ckpt).fingerprint, config_fingerprint(cfg)
        if saved and saved != now:
            raise ValueError(f"{path}: another data/model config (fingerprint {now}) than the weights in {ckpt} were "
                             f"trained with ({saved}, its {STATE_FILE}); was it edited, or rewritten by a later "
                             "recsys.train in this run dir? Restore the run's config, or evaluate the run it belongs to")
    return cfg


def evaluate_run(ecfg: EvaluateConfig) -> Optional[dict]:
    """Collective over all ranks; returns the report on rank 0 (None elsewhere)."""
    run_dir = Path(ecfg.run_dir)
    cfg = load_run_config(run_dir, ecfg.checkpoint)
    env = init_distributed(ecfg.device)  # this machine's device, not necessarily the training run's
    sharded = None
    try:
        sharded, report = _evaluate(ecfg, cfg, run_dir, env)
        return report
    finally:
        del sharded
        destroy_distributed(env)


def load_trained(cfg: Config, run_dir: Path, checkpoint: str, env: DistEnv, *, whole_data: bool = True):
    """Collective: (dataset, sharded model with the checkpoint's weights, checkpoint path) for this job's ranks.

    ``whole_data=False``: this rank reads only its own users' interactions (``rank_user_range``).
    """
    root = prepare_dataset_on_rank0(cfg.data, env)
    data = load_dataset(root, None if whole_data else rank_user_range(root, env))
    # weights only: the loss never runs (uniform item frequencies do), the sparse optimizer is never
    # stepped or loaded (SGD keeps no state), and the run's GPU-only sharding choices give way on a
    # CPU machine (DCP reshards)
    task = build_task(cfg, data, item_counts=np.ones(data.num_items, dtype=np.int64))
    sharded = shard_model(task, sharding=inference_sharding(cfg.sharding, env.device),
                          sparse=SparseOptimConfig(name="sgd"), dense=cfg.optim.dense, env=env, seed=cfg.trainer.seed)
    path = checkpoint_dir(run_dir, checkpoint)
    load_checkpoint(sharded, path, env=env, with_optimizer=False)
    return data, sharded, path


def _evaluate(ecfg: EvaluateConfig, cfg: Config, run_dir: Path, env: DistEnv):
    for split in ecfg.splits:
        if split not in PRECEDING_SPLITS:
            raise ValueError(f"splits: {split!r} is not evaluable; choose from {sorted(PRECEDING_SPLITS)}")
    # rank 0 builds the report from the whole dataset; the others only embed their own users
    data, sharded, checkpoint = load_trained(cfg, run_dir, ecfg.checkpoint, env, whole_data=env.is_main)
    lo, hi = data.user_range or rank_user_range(data.dir, env)  # read already, unless this rank holds every user
    two_tower = sharded.module.module.model
    two_tower.eval()
    builder = FeatureBuilder(data, cfg.data.history_length, query_uses_user_id(cfg))
    evaluator = Evaluator(data, builder, ks=ecfg.ks, batch_size=ecfg.batch_size, chunk_size=ecfg.chunk_size)
    common = dict(batch_size=ecfg.batch_size, device=env.device, rank=env.rank, world_size=env.world_size)

    if env.is_main:
        log.info("%s loaded; embedding %d items and the users of %s", checkpoint, data.num_items, ", ".join(ecfg.splits))
    item_emb = embed(two_tower, builder, side="candidate", ids=np.arange(data.num_items), timeline=None, **common)
    splits = {}
    for split in ecfg.splits:
        # rank 0 draws the users (all, or the sample) from the whole split; each rank embeds those in its range
        users, relevant, exclude, timeline = evaluator.protocol(split, max_users=ecfg.max_users, seed=ecfg.seed)
        if ecfg.max_users and env.world_size > 1:
            holder = [users if env.is_main else None]
            dist.broadcast_object_list(holder, src=0)
            users = holder[0]
        mine = users[(users >= lo) & (users < hi)]
        user_emb = embed(two_tower, builder, side="query", ids=mine, timeline=timeline, local=True, **common)
        user_emb = all_gather_rows(user_emb, env.world_size, device=env.device)  # rank order = ascending users
        if env.is_main:
            if user_emb.shape[0] != len(users):
                raise RuntimeError(f"{split}: gathered {user_emb.shape[0]} user embeddings for {len(users)} users")
            num_users = len(np.unique(data.splits[split].user_ids))
            sample = f"a uniform sample (seed {ecfg.seed}) of {len(users)} of the split's {num_users} users" if len(users) < num_users else ""
            splits[split] = SplitInputs(users=users, user_emb=user_emb, relevant=relevant, exclude=exclude,
                                        masked_splits=PRECEDING_SPLITS[split], sample=sample)
    report = None
    if env.is_main:
        train = data.splits["train"]
        inputs = EvalInputs(
            item_emb=item_emb, splits=splits, ks=ecfg.ks,
            train=UserItemCSR.from_pairs(train.user_ids, train.item_ids, num_users=data.num_users, num_items=data.num_items),
            item_train_counts=data.item_counts(), dataset_dir=data.dir, checkpoint=str(checkpoint.resolve()),
            extra={"run_dir": str(run_dir.resolve()), "world_size": env.world_size},
        )
        options = ReportOptions(ease=ecfg.ease, ease_max_items=ecfg.ease_max_items, ease_lambdas=tuple(ecfg.ease_lambdas),
                                ials=ecfg.ials, ann_kinds=ecfg.ann_kinds,
                                chunk_size=ecfg.chunk_size, device=env.device.type)
        out_dir = report_dir(ecfg, run_dir)
        report = evaluate_and_report(inputs, run_dir, options, out_dir=out_dir)
        print((out_dir / "report.md").read_text(), flush=True)
        log.info("report written to %s", out_dir)
    return sharded, report


ConfigStore.instance().store(name="evaluate_schema", node=EvaluateConfig)
register_configs()


@record
@hydra.main(config_path="../conf", config_name="evaluate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    setup_logging(int(os.environ.get("RANK", "0")))  # console: recsys's lines; library chatter: the log file, rank 0
    reject_unknown_keys(cfg)
    evaluate_run(OmegaConf.to_object(cfg))


if __name__ == "__main__":
    main()
