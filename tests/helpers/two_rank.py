"""The 2-rank trainings that tests/rundir/test_fault_tolerance.py and tests/distributed/test_multiprocess.py check.

They all run in one torchrun launch (tests/helpers/run_jobs.py, the ``two_rank_runs`` fixture of
tests/conftest.py): each is ``+experiment=tiny`` with the overrides below (plus ``data.root``). A test
asks for the ones it reads with ``@pytest.mark.two_rank_runs("name", ...)``.
"""

# tests/rundir/test_fault_tolerance.py: 2 epochs of 10 steps, a checkpoint every 4 (steps 4, 8, 10, 12, 16, 20)
FAULT_TOLERANCE = [
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=10",
    "trainer.checkpoint_every_steps=4",
    "trainer.early_stopping_patience=0",
    "model.negatives.num=8",
    "model.query_user_id=true",  # all three tables (the tiny default's profile bag has no user table): more to reshard
]

# tests/distributed/test_multiprocess.py: a loss logged every step, compared with one process's
MULTIPROCESS = [
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=12",
    "trainer.log_every_steps=1",
    "trainer.early_stopping_patience=0",
    "model.negatives.num=16",
    "sharding.device=cpu",
]
# 15944 training rows in batches of 1001: 15 odd-sized global batches (501 + 500 rows per rank)
# and a last one of 929; one whole epoch, every example exactly once.
UNEVEN = ["trainer.global_batch_size=1001", "trainer.epochs=1", "trainer.max_steps_per_epoch=0"]

# tests/distributed/test_multiprocess.py: the SASRec query encoder (its own EmbeddingCollection table) on temporal leave-one-out;
# no dropout, whose masks each rank would draw from its own generator
SASREC = [
    "data.protocol=loo",
    "data.query_history=recent",
    "model/query_encoder=sasrec",
    "model.query_encoder.dropout=0",
    "model.query_encoder.dim=16",
]

# tests/e2e/test_continuous.py: the tiny log with item churn replayed as 3 daily slices through managed-collision tables,
# each slice warm-started from the one before ({two_rank_root}: the folder of these run dirs). The item table
# (224 rows: 223 ids, 111 per rank on 2) holds slices 0 and 1's items and overflows in slice 2 (LRU evicts)
CONTINUOUS = [
    "data.synthetic.churn_periods=4",
    "data.slices=4",
    "data.train_on_valid=true",
    "data.item_neighbors=0",
    "model.query_user_id=true",
    "model.id_mapping=managed",
    "model.managed.zch_size.user=512",
    "model.managed.zch_size.item=224",
    "trainer.epochs=2",
    "trainer.early_stopping_patience=0",
    "trainer.log_every_steps=1",
    "trainer.init_optimizer=true",
    "sharding.device=cpu",
]


def continuous_slice(k: int, root: str = "{two_rank_root}", prefix: str = "continuous_") -> list[str]:
    """The overrides of slice ``k`` of the replay, warm-started from ``<root>/<prefix><k - 1>``."""
    return [*CONTINUOUS, f"data.slice={k}"] + ([f"trainer.init_from={root}/{prefix}{k - 1}"] if k else [])


JOBS = {
    "uninterrupted": FAULT_TOLERANCE,
    "uninterrupted_by_user": [*FAULT_TOLERANCE, "data.shard_by_user=true"],
    "table_wise_uneven": [*MULTIPROCESS, "sharding=table_wise", *UNEVEN, "trainer.pipeline=none"],
    # + the loss masking each query's bag (its bags read beside the KJT the pipeline distributes)
    "column_wise_pipeline": [
        *MULTIPROCESS,
        "sharding=column_wise",
        "trainer.pipeline=sparse_dist",
        "model.loss.mask_history=true",
    ],
    "sasrec_pipeline": [*MULTIPROCESS, *SASREC, "sharding=table_wise", "trainer.pipeline=sparse_dist"],
    # + the refit on train + valid, each rank merging its own users' rows (1 more epoch)
    "by_user_uneven": [
        *MULTIPROCESS,
        "data.shard_by_user=true",
        "trainer.pipeline=sparse_dist",
        *UNEVEN,
        "trainer.refit=true",
    ],
    **{f"continuous_{k}": continuous_slice(k) for k in range(3)},  # in this order: names sort as they must run
}
