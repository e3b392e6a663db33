"""The CUDA path: NCCL, row-wise sharding, UVM caching, the fused Adam family, the sparse-dist pipeline,
and evaluation and export of a GPU-trained run.

Skipped on machines without a CUDA device (CI); run with scripts/gpu_check.sh on a GPU machine.
Each test runs the real command line in a subprocess, so it gets its own NCCL process group.
"""

import json

import pytest
import torch

from tests.helpers.launch import launch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device: run scripts/gpu_check.sh on a GPU machine"
    ),
]


def train(run_dir, data_root, *overrides, nproc=1):
    launch(
        [
            "-m",
            "recsys.train",
            "+experiment=tiny",
            "sharding.device=cuda",
            "trainer.epochs=2",
            "trainer.log_every_steps=1",
            "trainer.early_stopping_patience=0",
            f"hydra.run.dir={run_dir}",
            f"data.root={data_root}",
            *overrides,
        ],
        nproc=nproc,
        timeout=120,
    )  # within gpu_check's budget
    losses = [
        json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    return losses, json.loads((run_dir / "results.json").read_text())


@pytest.mark.parametrize(
    "overrides",
    [
        ["sharding=gpu_row_wise", "trainer.pipeline=sparse_dist", "optim/sparse=adam"],
        ["sharding=uvm_caching", "optim/sparse=partial_rowwise_adam"],
        [  # + the loss's history mask, built on the device (no host sync)
            "sharding=table_wise",
            "sharding.device=cuda",
            "optim/sparse=rowwise_adagrad",
            "trainer.pipeline=sparse_dist",
            "model.loss.mask_history=true",
        ],
        ["sharding=table_wise", "data.shard_by_user=true", "trainer.pipeline=sparse_dist"],
    ],
    ids=[
        "row_wise-adam-pipeline",
        "uvm_caching-partial_rowwise_adam",
        "table_wise-rowwise_adagrad-pipeline-history_mask",
        "shard_by_user-pipeline",
    ],
)
def test_cuda_training_learns(tmp_path, data_root, tiny_data, overrides):
    losses, results = train(tmp_path, data_root, *overrides)
    assert losses[-1] < losses[0]
    assert results["test"]["two_tower"]["recall@20"] > results["test"]["popularity"]["recall@20"]


def test_gpu_trained_run_evaluates_and_exports(tmp_path, data_root, tiny_data):
    """Export gathers the sharded tables over NCCL into a CPU bundle; the run evaluates on the CPU (its
    GPU-only plan gives way) and agrees with training's test recall, which was ranked on the GPU."""
    from recsys.serving.bundle import load_bundle

    run_dir = tmp_path / "run"
    train(run_dir, data_root, "sharding=gpu_row_wise", "optim/sparse=adam", "trainer.max_steps_per_epoch=10")
    for args in (
        ["-m", "recsys.export", f"run_dir={run_dir}"],
        ["-m", "recsys.evaluate", f"run_dir={run_dir}", "ann_kinds=[]", "device=cpu"],
    ):
        launch(args, timeout=120)
        if args[1] == "recsys.evaluate":
            report = json.loads((run_dir / "eval" / "report.json").read_text())
            recall = report["splits"]["test"]["metrics"]["two_tower"]["recall@20"]
            assert recall == pytest.approx(
                json.loads((run_dir / "results.json").read_text())["test"]["two_tower"]["recall@20"], abs=1e-3
            )
    bundle = load_bundle(run_dir / "export")
    assert bundle.item_embeddings.shape[0] == tiny_data.num_items


def test_cuda_matches_cpu_curve(tmp_path, data_root, tiny_data):
    """Same seeds and batches: the GPU run follows the CPU run (float differences only)."""
    cpu, _ = train(tmp_path / "cpu", data_root, "sharding.device=cpu", "trainer.max_steps_per_epoch=10")
    gpu, _ = train(tmp_path / "gpu", data_root, "trainer.max_steps_per_epoch=10")
    for a, b in zip(cpu, gpu):
        assert b == pytest.approx(a, rel=1e-3, abs=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpus_follow_one(tmp_path, data_root, tiny_data):
    one, _ = train(tmp_path / "one", data_root, "trainer.max_steps_per_epoch=10")
    two, _ = train(tmp_path / "two", data_root, "trainer.max_steps_per_epoch=10", "sharding=gpu_row_wise", nproc=2)
    for a, b in zip(one, two):
        assert b == pytest.approx(a, rel=1e-3, abs=1e-3)


def test_exact_topk_on_the_device_gives_the_host_paths_ids():
    """chunked_topk's device path on CUDA (the CSR's ids staged in page-locked memory and copied on a side stream,
    candidates by groups, tie fix-ups decided a chunk late) against the host path: the same ids and scores; and
    without ties, no stream sync at all (the host waits on each chunk's event only)."""
    import numpy as np

    from recsys.ranking.interactions import UserItemCSR
    from recsys.ranking.retrieval import exact_topk

    rng = np.random.default_rng(0)
    queries = torch.from_numpy(rng.integers(-2, 3, size=(500, 4)).astype(np.float32))  # many equal scores
    items = torch.from_numpy(rng.integers(-2, 3, size=(3000, 4)).astype(np.float32))
    lengths = rng.integers(0, 2990, 500)
    exclude = UserItemCSR.from_pairs(
        np.repeat(np.arange(500), lengths),
        np.concatenate([rng.choice(3000, n, replace=False) for n in lengths]),
        num_users=500,
        num_items=3000,
    )
    host = exact_topk(queries, items, 20, exclude=exclude, chunk_size=64)
    device = exact_topk(queries.cuda(), items.cuda(), 20, exclude=exclude, chunk_size=64)
    assert torch.equal(device[1].cpu(), host[1]) and torch.equal(device[0].cpu(), host[0])
    # no tie anywhere (no fix-ups), scores exact in fp32 on both (random floats would round differently in the two
    # matmuls): score(u, i) = a_u * perm(i) + b_u, a_u != 0; top-100 by groups (20,000 >= 4 x 101 x 32): no stream sync
    a = torch.from_numpy(rng.choice([-5, -3, -1, 1, 2, 4], 700).astype(np.float32))
    queries = torch.stack([a, torch.from_numpy(rng.integers(-9, 10, 700).astype(np.float32))], dim=1)
    items = torch.stack([torch.from_numpy(rng.permutation(20000).astype(np.float32)), torch.ones(20000)], dim=1)
    exclude = UserItemCSR.from_pairs(
        np.repeat(np.arange(700), 50), rng.integers(0, 20000, 35000), num_users=700, num_items=20000
    )
    host = exact_topk(queries, items, 100, exclude=exclude, chunk_size=256)
    queries, items = queries.cuda(), items.cuda()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the default; TF32 would round perm(i)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a stream sync (.item(), nonzero, a pageable copy) raises
    try:
        device = exact_topk(queries, items, 100, exclude=exclude, chunk_size=256)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert torch.equal(device[1].cpu(), host[1]) and torch.equal(device[0].cpu(), host[0])
