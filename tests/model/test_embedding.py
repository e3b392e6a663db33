"""Sharded tables: lookups equal nn.EmbeddingBag, fused updates touch only looked-up rows, init is plan-independent."""

import numpy as np
import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from recsys.components.losses.softmax import Config as SoftmaxConfig
from recsys.config import DenseOptimConfig, ShardingConfig, SparseOptimConfig, TableShardingConfig
from recsys.data.batch import Batch
from recsys.data.features import build_kjt
from recsys.data.layout import feature_layout
from recsys.distributed.sharding import shard_model
from recsys.distributed.table_init import BLOCK_ROWS, fill_rows
from recsys.model.task import RetrievalTask
from recsys.model.two_tower import TwoTower, table_configs

NUM_ROWS = {"user": 50, "item": 40, "category": 7}
DIMS = {"user": 8, "item": 16, "category": 4}
POOLING = {"user": "sum", "item": "mean", "category": "mean"}


def make_sharded(process_group, sharding_type="table_wise", optimizer="rowwise_adagrad", weight_decay=0.0):
    configs = table_configs(num_rows=NUM_ROWS, dims=DIMS, poolings=POOLING)
    torch.manual_seed(0)
    task = RetrievalTask(
        TwoTower(configs, query_tables=feature_layout(history_length=5).tower_keys("query"), tower_dims=[12, 8]),
        item_counts=torch.ones(NUM_ROWS["item"]),
        loss=SoftmaxConfig(temperature=0.2, mask_history=False).build(),  # a hand-built batch: no bags
        num_negatives=0,
    )
    sharding = ShardingConfig(
        device="cpu", tables={t: TableShardingConfig(sharding_types=[sharding_type]) for t in NUM_ROWS}
    )
    return shard_model(
        task,
        sharding=sharding,
        sparse=SparseOptimConfig(name=optimizer, lr=0.1, weight_decay=weight_decay),
        dense=DenseOptimConfig(),
        env=process_group,
        seed=3,
    )


def random_batch(rng, batch_size=6):
    """Random jagged features in the batch layout (query rows, then candidate rows), including empty history bags."""
    ones, zeros = np.ones(batch_size, dtype=np.int64), np.zeros(batch_size, dtype=np.int64)
    candidates = rng.permutation(NUM_ROWS["item"])[:batch_size]
    lengths = {
        "user": np.concatenate([ones, zeros]),
        "item": np.concatenate([rng.integers(0, 4, batch_size), ones]),
        "category": np.concatenate([rng.integers(0, 5, batch_size), rng.integers(1, 4, batch_size)]),
    }
    values = {
        "user": rng.integers(0, NUM_ROWS["user"], batch_size),
        "item": np.concatenate([rng.integers(0, NUM_ROWS["item"], lengths["item"][:batch_size].sum()), candidates]),
        "category": rng.integers(0, NUM_ROWS["category"], lengths["category"].sum()),
    }
    return Batch(build_kjt(list(NUM_ROWS), lengths, values), torch.from_numpy(candidates), batch_size), lengths, values


def full_tables(module):
    out = {}
    for key, value in module.state_dict().items():
        if ".embedding_bags." in key:
            tensor = value.local_shards()[0].tensor if isinstance(value, ShardedTensor) else value
            out[key.split(".")[-2]] = tensor.detach().clone()
    return out


@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise"])
def test_sharded_lookups_equal_embedding_bag_reference(process_group, sharding_type):
    sharded = make_sharded(process_group, sharding_type)
    tables = full_tables(sharded.module)
    rng = np.random.default_rng(1)
    for _ in range(3):
        batch, lengths, values = random_batch(rng)
        pooled = sharded.two_tower.ebc(batch.features).to_dict()
        for table in NUM_ROWS:
            ref = torch.nn.EmbeddingBag.from_pretrained(tables[table], mode=POOLING[table])
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths[table])[:-1]]))
            expected = ref(torch.from_numpy(values[table]), offsets)
            torch.testing.assert_close(pooled[table], expected, rtol=1e-5, atol=1e-6, msg=table)


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "sgd"])
def test_fused_step_changes_exactly_the_looked_up_rows(process_group, optimizer):
    sharded = make_sharded(process_group, optimizer=optimizer)
    before = full_tables(sharded.module)
    batch, lengths, values = random_batch(np.random.default_rng(2))
    loss, _ = sharded.module(batch)
    loss.backward()
    sharded.optimizer.step()
    after = full_tables(sharded.module)
    for table in NUM_ROWS:
        looked_up = set(values[table].tolist())
        changed = (after[table] != before[table]).any(dim=1).nonzero().flatten().tolist()
        assert set(changed) == looked_up, table


def test_sparse_weight_decay_is_refused_on_cpu_and_reaches_the_cuda_kernel_with_its_mode(process_group):
    """fbgemm ignores weight_decay unless weight_decay_mode is set; on CPU it ignores it even then
    (updates measured bit-identical), so a CPU run refuses it instead of training without it."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

    from recsys.distributed.sharding import sparse_fused_params

    with pytest.raises(ValueError, match=r"optim.sparse.weight_decay=0.5: fbgemm's CPU kernels ignore weight decay"):
        make_sharded(process_group, weight_decay=0.5)
    assert sparse_fused_params(SparseOptimConfig(weight_decay=1e-4)) == {"weight_decay_mode": WeightDecayMode.L2}
    assert sparse_fused_params(SparseOptimConfig()) is None


def test_gpu_only_sparse_optimizer_is_refused_on_cpu(process_group):
    with pytest.raises(ValueError, match="optim.sparse.name='adam' has no fused fbgemm kernel on cpu"):
        make_sharded(process_group, optimizer="adam")


def test_initial_tables_do_not_depend_on_the_plan(process_group):
    a = full_tables(make_sharded(process_group, "table_wise").module)
    b = full_tables(make_sharded(process_group, "column_wise").module)
    for table in NUM_ROWS:
        assert torch.equal(a[table], b[table])
        bound = NUM_ROWS[table] ** -0.5
        assert a[table].abs().max() <= bound and a[table].std() > bound / 4


def test_fill_rows_of_any_shard_equals_the_same_slice_of_the_full_table():
    num_rows, dim = BLOCK_ROWS + 1000, 6
    full = torch.empty(num_rows, dim)
    fill_rows(full, seed=5, table="item", row0=0, col0=0, num_rows=num_rows, dim=dim)
    # a shard straddling the block boundary, columns 2..5
    part = torch.empty(2400, 3)
    fill_rows(part, seed=5, table="item", row0=BLOCK_ROWS - 1500, col0=2, num_rows=num_rows, dim=dim)
    assert torch.equal(part, full[BLOCK_ROWS - 1500 : BLOCK_ROWS + 900, 2:5])
    other = torch.empty(num_rows, dim)
    fill_rows(other, seed=6, table="item", row0=0, col0=0, num_rows=num_rows, dim=dim)
    assert not torch.equal(other, full)


def test_cuda_only_sharding_choices_are_refused_on_cpu():
    import torch

    from recsys.distributed.sharding import planner_constraints

    tables = {"user", "item", "category"}
    uvm = ShardingConfig(tables={"item": TableShardingConfig(compute_kernels=["fused_uvm_caching"])})
    with pytest.raises(ValueError, match="sharding.tables.item.compute_kernels: 'fused_uvm_caching' needs CUDA"):
        planner_constraints(uvm, torch.device("cpu"), tables)
    row_wise = ShardingConfig(tables={"user": TableShardingConfig(sharding_types=["row_wise"])})
    with pytest.raises(ValueError, match="sharding.tables.user.sharding_types: 'row_wise' needs CUDA"):
        planner_constraints(row_wise, torch.device("cpu"), tables)
    ssd = ShardingConfig(tables={"item": TableShardingConfig(compute_kernels=["key_value"])})
    with pytest.raises(ValueError, match="'key_value' is not a training kernel recsys supports"):
        planner_constraints(ssd, torch.device("cuda"), tables)
    # on CUDA both are valid constraints, and an empty list means every model-parallel type
    planner_constraints(uvm, torch.device("cuda"), tables)
    auto = planner_constraints(ShardingConfig(tables={"user": TableShardingConfig()}), torch.device("cuda"), tables)
    assert "row_wise" in auto["user"].sharding_types and "data_parallel" not in auto["user"].sharding_types


EXPECTED_KERNEL_OPTIMIZER = {
    "sgd": "EXACT_SGD",
    "adagrad": "EXACT_ADAGRAD",
    "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD",
    "adam": "ADAM",
    "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM",
    "lamb": "LAMB",
    "partial_rowwise_lamb": "PARTIAL_ROWWISE_LAMB",
}


@pytest.mark.parametrize("name", sorted(EXPECTED_KERNEL_OPTIMIZER))
def test_sparse_optimizer_settings_reach_fbgemm_under_its_own_names(name):
    """What runs on GPU only, checked on CPU: torchrec builds the optimizer class on the parameter at once
    (apply_optimizer_in_backward), maps the class to fbgemm's optimizer, and passes the kwargs (lr renamed
    learning_rate) to fbgemm's kernel constructor, which has no **kwargs: an unknown name is a TypeError there."""
    import inspect

    from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
    from torchrec.distributed.utils import merge_fused_params, optimizer_type_to_emb_opt_type

    from recsys.distributed.sharding import SPARSE_OPTIMIZERS, sparse_fused_params, sparse_optimizer_kwargs

    assert set(SPARSE_OPTIMIZERS) == set(EXPECTED_KERNEL_OPTIMIZER)
    cfg = SparseOptimConfig(name=name, lr=0.2, eps=1e-6, beta1=0.8, beta2=0.99, weight_decay=0.01)
    cls, kwargs = sparse_optimizer_kwargs(cfg, torch.device("cuda"))
    cls([torch.nn.Parameter(torch.zeros(3, 2))], **kwargs)
    assert optimizer_type_to_emb_opt_type(cls).name == EXPECTED_KERNEL_OPTIMIZER[name]
    fused = merge_fused_params(
        sparse_fused_params(cfg), dict(kwargs)
    )  # the sharder's (weight_decay_mode) + the optimizer's
    accepted = inspect.signature(SplitTableBatchedEmbeddingBagsCodegen.__init__).parameters
    assert set(fused) <= set(accepted), f"fbgemm has no parameter {sorted(set(fused) - set(accepted))}"
    assert fused["learning_rate"] == 0.2 and fused["weight_decay"] == 0.01
    if name in ("adam", "partial_rowwise_adam", "lamb", "partial_rowwise_lamb"):
        assert (fused["beta1"], fused["beta2"], fused["eps"]) == (0.8, 0.99, 1e-6)


def test_planner_sees_this_hosts_memory_unless_configured():
    from recsys.distributed.env import DistEnv
    from recsys.distributed.sharding import GB, host_memory_bytes, planner_topology

    env = DistEnv(rank=0, world_size=4, local_world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    measured = planner_topology(ShardingConfig(), env)
    assert [d.storage.ddr for d in measured.devices] == [host_memory_bytes() // 2] * 4
    assert 1 * GB < host_memory_bytes() < 64 * 1024 * GB  # read from this machine, not torchrec's 128 GB guess
    assert all(d.storage.hbm == 0 for d in measured.devices)  # a CPU topology has no HBM
    configured = planner_topology(ShardingConfig(ddr_cap_gb=1.5), env)
    assert [d.storage.ddr for d in configured.devices] == [int(1.5 * GB)] * 4


@pytest.mark.parametrize(
    "query_keys, candidate_keys",
    [
        (["user", "item", "category"], ["item", "category"]),  # the default layout: adjacent runs, views
        (["item", "neighbor"], ["item", "neighbor"]),  # Gowalla's: both towers read every column
        (["category", "user", "side"], ["neighbor", "item"]),  # out of order, across two KeyedTensors
        ([], ["item"]),  # the sequence encoder alone: no pooled query columns
    ],
)
def test_tower_inputs_equal_torchrecs_regroup_forward_and_backward(query_keys, candidate_keys):
    """The towers' inputs are the rows and columns KeyedTensor.regroup gives, and so are the gradients the
    pooled lookups get back (managed ids: a second KeyedTensor of other keys)."""
    from torchrec.sparse.jagged_tensor import KeyedTensor

    from recsys.model.two_tower import tower_inputs

    num_queries, num_candidates = 5, 7
    dims = {"user": 3, "item": 4, "neighbor": 2, "category": 5, "side": 1}

    def pooled(seed):
        g = torch.Generator().manual_seed(seed)
        first, second = ["user", "item", "category"], ["neighbor", "side"]
        values = [
            torch.randn(num_queries + num_candidates, sum(dims[k] for k in ks), generator=g) for ks in (first, second)
        ]
        values = [v.requires_grad_() for v in values]
        kts = [
            KeyedTensor(keys=ks, length_per_key=[dims[k] for k in ks], values=v)
            for ks, v in zip((first, second), values)
        ]
        return kts, values

    ours, our_leaves = pooled(0)
    query_in, candidate_in = tower_inputs(ours, query_keys, candidate_keys, num_queries)
    theirs, their_leaves = pooled(0)
    if query_keys:
        expected_query, expected_candidate = KeyedTensor.regroup(theirs, [query_keys, candidate_keys])
    else:
        (expected_candidate,) = KeyedTensor.regroup(theirs, [candidate_keys])
        expected_query = expected_candidate[:, :0]
    expected_query, expected_candidate = expected_query[:num_queries], expected_candidate[num_queries:]
    assert query_in.shape == (num_queries, sum(dims[k] for k in query_keys))
    assert torch.equal(query_in, expected_query) and torch.equal(candidate_in, expected_candidate)

    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g) for t in (query_in, candidate_in)]
    sum((t * w).sum() for t, w in zip((query_in, candidate_in), weights)).backward()
    sum((t * w).sum() for t, w in zip((expected_query, expected_candidate), weights)).backward()
    for mine, reference in zip(our_leaves, their_leaves):
        if reference.grad is None:  # a KeyedTensor neither tower reads
            assert mine.grad is None or not mine.grad.any()
        else:
            assert torch.equal(mine.grad, reference.grad)


def test_bench_run_step_times_each_variant_and_puts_the_towers_split_back(data_root, tiny_data, process_group):
    """scripts/bench_run_step.py on the tiny run: a figure per variant, and recsys's own split restored after
    timing torchrec's regroup (the script swaps it in module-wide)."""
    import importlib.util
    from pathlib import Path

    import recsys.model.two_tower as two_tower

    path = Path(__file__).resolve().parents[2] / "scripts" / "bench_run_step.py"
    spec = importlib.util.spec_from_file_location("bench_run_step", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    ours = two_tower.tower_inputs
    out = bench.main(
        [
            "+experiment=tiny",
            f"data.root={data_root}",
            "--variants",
            "split=tower_inputs,split=regroup,precision=bf16+threads=1+loader=live",
        ]
        + ["--batches", "3", "--rounds", "2", "--warmup", "1"]
    )
    assert two_tower.tower_inputs is ours
    for variant in ("split=tower_inputs", "split=regroup", "precision=bf16+threads=1+loader=live"):
        assert out[variant]["wall_ms"] > 0 and out[variant]["cpu_ms"] > 0
    assert out["split=tower_inputs"]["paired_ratio"] == 1.0 and 0 <= out["steal_share"] <= 1
    with pytest.raises(SystemExit, match="split=permute"):
        bench.main(["+experiment=tiny", f"data.root={data_root}", "--variants", "split=permute"])
