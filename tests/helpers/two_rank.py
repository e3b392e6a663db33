"""The 2-rank trainings that tests/test_fault_tolerance.py and tests/test_multiprocess.py check.

They all run in one torchrun launch (tests/helpers/run_jobs.py, the ``two_rank_runs`` fixture of
tests/conftest.py): each is ``+experiment=tiny`` with the overrides below (plus ``data.root``). A test
asks for the ones it reads with ``@pytest.mark.two_rank_runs("name", ...)``.
"""

# tests/test_fault_tolerance.py: 2 epochs of 10 steps, a checkpoint every 4 (steps 4, 8, 10, 12, 16, 20)
FAULT_TOLERANCE = [
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=10",
    "trainer.checkpoint_every_steps=4",
    "trainer.early_stopping_patience=0",
    "model.num_uniform_negatives=8",
    "model.query_user_id=true",  # all three tables (the tiny default's profile bag has no user table): more to reshard
]

# tests/test_multiprocess.py: a loss logged every step, compared with one process's
MULTIPROCESS = [
    "trainer.epochs=2",
    "trainer.max_steps_per_epoch=12",
    "trainer.log_every_steps=1",
    "trainer.early_stopping_patience=0",
    "model.num_uniform_negatives=16",
    "sharding.device=cpu",
]
# 15944 training rows in batches of 1001: 15 odd-sized global batches (501 + 500 rows per rank)
# and a last one of 929; one whole epoch, every example exactly once.
UNEVEN = ["trainer.global_batch_size=1001", "trainer.epochs=1", "trainer.max_steps_per_epoch=0"]

# tests/test_multiprocess.py: the SASRec query encoder (its own EmbeddingCollection table) on temporal leave-one-out;
# no dropout, whose masks each rank would draw from its own generator
SASREC = [
    "data.protocol=loo",
    "data.query_history=recent",
    "model.query_encoder=sasrec",
    "model.sasrec.dropout=0",
    "model.sasrec.dim=16",
]

JOBS = {
    "uninterrupted": FAULT_TOLERANCE,
    "uninterrupted_by_user": [*FAULT_TOLERANCE, "data.shard_by_user=true"],
    "table_wise_uneven": [*MULTIPROCESS, "sharding=table_wise", *UNEVEN, "trainer.pipeline=none"],
    "column_wise_pipeline": [*MULTIPROCESS, "sharding=column_wise", "trainer.pipeline=sparse_dist"],
    "sasrec_pipeline": [*MULTIPROCESS, *SASREC, "sharding=table_wise", "trainer.pipeline=sparse_dist"],
    # + the refit on train + valid, each rank merging its own users' rows (1 more epoch)
    "by_user_uneven": [
        *MULTIPROCESS,
        "data.shard_by_user=true",
        "trainer.pipeline=sparse_dist",
        *UNEVEN,
        "trainer.refit=true",
    ],
}
