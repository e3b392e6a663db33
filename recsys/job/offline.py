"""The offline evaluation of a trained run: embed users and items on every rank, report on rank 0.

``recsys.job.trained.evaluate_run`` loads the run (``load_trained``) and calls :func:`evaluate_trained`;
the report itself (baselines, ANN, files) is ``recsys.evaluation.report``, on plain arrays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch.distributed as dist

from recsys.config import Config, EvaluateConfig
from recsys.data.feature_builder import FeatureBuilder
from recsys.distributed.collectives import all_gather_rows
from recsys.distributed.env import DistEnv
from recsys.distributed.rank_data import rank_user_range
from recsys.evaluation.report import EVAL_DIR, EvalInputs, ReportOptions, SplitInputs, evaluate_and_report
from recsys.job.ranker_choice import report_defaults, report_rankers
from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.sharded import PRECEDING_SPLITS, Evaluator, embed
from recsys.ranking.untrained import unranked_items

log = logging.getLogger("recsys.evaluate")


def check_splits(splits: Sequence[str]) -> None:
    for split in splits:
        if split not in PRECEDING_SPLITS:
            raise ValueError(f"splits: {split!r} is not evaluable; choose from {sorted(PRECEDING_SPLITS)}")


def report_dir(ecfg: EvaluateConfig, run_dir: Path) -> Path:
    if ecfg.out_dir:
        return Path(ecfg.out_dir)
    # eval/ is also the evaluate entry point's Hydra run dir (conf/evaluate.yaml)
    return run_dir / (f"eval_sample_{ecfg.max_users}_seed_{ecfg.seed}" if ecfg.max_users else EVAL_DIR)


def _embed_split_users(
    ecfg: EvaluateConfig, evaluator: Evaluator, split: str, embed_users, env: DistEnv, user_range
) -> SplitInputs | None:
    """Collective: one split's users embedded (each rank those in its range), gathered to rank 0 (None elsewhere)."""
    data = evaluator.data
    lo, hi = user_range
    # rank 0 draws the users (all, or the sample) from the whole split; each rank embeds those in its range
    users, relevant, exclude, timeline = evaluator.protocol(split, max_users=ecfg.max_users, seed=ecfg.seed)
    if ecfg.max_users and env.world_size > 1:
        holder = [users if env.is_main else None]
        dist.broadcast_object_list(holder, src=0)
        users = holder[0]
    mine = users[(users >= lo) & (users < hi)]
    user_emb = all_gather_rows(
        embed_users(mine, timeline), env.world_size, device=env.device
    )  # rank order = ascending users
    if not env.is_main:
        return None
    if user_emb.shape[0] != len(users):
        raise RuntimeError(f"{split}: gathered {user_emb.shape[0]} user embeddings for {len(users)} users")
    num_users = len(np.unique(data.splits[split].user_ids))
    sample = (
        f"a uniform sample (seed {ecfg.seed}) of {len(users)} of the split's {num_users} users"
        if len(users) < num_users
        else ""
    )
    return SplitInputs(
        users=users,
        user_emb=user_emb,
        relevant=relevant,
        exclude=exclude,
        masked_splits=PRECEDING_SPLITS[split],
        sample=sample,
    )


def evaluate_trained(ecfg: EvaluateConfig, cfg: Config, run_dir: Path, env: DistEnv, trained) -> dict | None:
    """Collective: the report of ``trained`` (recsys.job.trained.TrainedRun: the run's data, layout and weights)
    over ``ecfg.splits``; rank 0 returns it and prints report.md."""
    data, checkpoint = trained.data, trained.checkpoint
    user_range = data.user_range or rank_user_range(data.dir, env)  # read already, unless this rank holds every user
    two_tower = trained.sharded.two_tower
    two_tower.eval()
    builder = FeatureBuilder(data, layout=trained.layout)
    evaluator = Evaluator(data, builder, ks=ecfg.ks, batch_size=ecfg.batch_size, chunk_size=ecfg.chunk_size)
    common = dict(batch_size=ecfg.batch_size, device=env.device, rank=env.rank, world_size=env.world_size)

    def embed_users(users, timeline):
        return embed(two_tower, builder, side="query", ids=users, timeline=timeline, local=True, **common)

    names = [s for s in ecfg.splits if not (s == "valid" and data.valid_in_train)]
    if env.is_main:
        if len(names) < len(ecfg.splits):  # baselines then skip their tuning too
            log.info("the run trained on its valid split (data.train_on_valid): valid is not evaluated")
        log.info("%s loaded; embedding %d items and the users of %s", checkpoint, data.num_items, ", ".join(names))
    item_emb = embed(two_tower, builder, side="candidate", ids=np.arange(data.num_items), timeline=None, **common)
    # never-trained items of managed tables: left out, as the run left them out
    unranked = unranked_items(data, two_tower, device=env.device, world_size=env.world_size)
    splits = {split: _embed_split_users(ecfg, evaluator, split, embed_users, env, user_range) for split in names}
    if not env.is_main:
        return None
    train = data.splits["train"]
    inputs = EvalInputs(
        item_emb=item_emb,
        splits=splits,
        ks=ecfg.ks,
        train=UserItemCSR.from_pairs(
            train.user_ids, train.item_ids, num_users=data.num_users, num_items=data.num_items
        ),
        item_train_counts=data.item_counts(),
        dataset_dir=data.dir,
        checkpoint=str(checkpoint.resolve()),
        extra={"run_dir": str(run_dir.resolve()), "world_size": env.world_size},
        graphs={split: evaluator.csr(evaluator.protocol(split).timeline) for split in names},
        unranked_items=None if unranked is None else unranked.numpy(),
    )
    options = _report_options(ecfg, cfg, env, data.num_items)
    out_dir = report_dir(ecfg, run_dir)
    report = evaluate_and_report(inputs, run_dir, options, out_dir=out_dir)
    print((out_dir / "report.md").read_text(), flush=True)
    log.info("report written to %s", out_dir)
    return report


def _report_options(ecfg: EvaluateConfig, cfg: Config, env: DistEnv, num_items: int) -> ReportOptions:
    """The report's settings: the entry point's, and the run's rankers and their ``eval`` settings (the entry point's
    ``settings`` over the run's, ranker by ranker)."""
    given = ecfg.settings or {}
    settings = {
        name: {**cfg.eval.settings.get(name, {}), **given.get(name, {})} for name in {*cfg.eval.settings, *given}
    }
    return ReportOptions(
        stage_rankers=report_rankers(cfg, ecfg.rankers, num_items),
        default_rankers=report_defaults(cfg, ecfg.rankers, num_items),
        ranker_config=replace(cfg.eval, settings=settings),
        ann_kinds=ecfg.ann_kinds,
        chunk_size=ecfg.chunk_size,
        device=env.device.type,
    )
