"""The one place a model gets sharded: planner -> DistributedModelParallel -> optimizers.

Embedding tables get a sparse optimizer fused into backward (fbgemm's table-batched kernels
update only the looked-up rows while gradients are computed); towers, and any table the plan
makes data_parallel (which has no fused kernel), get the dense optimizer.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import HardwareConfig, KernelConfig, ParameterConstraints, TopologyFactory
from torchrec.distributed.planner.types import TrainerConfig as PlannerTrainerConfig
from torchrec.distributed.types import CacheParams, ShardingEnv, ShardingPlan, ShardingType
from torchrec.optim import LAMB, Adam, PartialRowWiseAdam, PartialRowWiseLAMB, RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from recsys.config import DenseOptimConfig, ShardingConfig, SparseOptimConfig
from recsys.data.features import ALL_TABLES, SEQUENCE_TABLE
from recsys.distributed.collectives import candidate_gather
from recsys.distributed.env import DistEnv
from recsys.distributed.managed import MANAGED_SHARDING, ManagedSharder, set_buckets, zero_managed_tables
from recsys.distributed.pretrained import load_pretrained_table, open_pretrained
from recsys.distributed.table_init import init_tables

log = logging.getLogger(__name__)

# name -> (optimizer class, devices whose fbgemm kernels implement it). torchrec maps the class to
# fbgemm's EmbOptimType and passes the kwargs (lr renamed learning_rate) to fbgemm's kernel
# constructor, so the kwargs use fbgemm's names (beta1 / beta2, not torch's betas) and the Adam
# family uses torchrec's placeholders, which accept them.
SPARSE_OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], tuple[str, ...]]] = {
    "sgd": (torch.optim.SGD, ("cpu", "cuda")),
    "adagrad": (torch.optim.Adagrad, ("cpu", "cuda")),
    "rowwise_adagrad": (RowWiseAdagrad, ("cpu", "cuda")),
    # fbgemm's Adam family: "not supported in CPU mode"
    "adam": (Adam, ("cuda",)),
    "partial_rowwise_adam": (PartialRowWiseAdam, ("cuda",)),  # Adam with one second moment per row
    "lamb": (LAMB, ("cuda",)),
    "partial_rowwise_lamb": (PartialRowWiseLAMB, ("cuda",)),
}
DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}
CPU_SHARDING_TYPES = {"data_parallel", "table_wise", "column_wise", "table_column_wise"}
# Training kernels per device: fused = fbgemm TBE with the optimizer in backward; dense = plain
# autograd (data_parallel); UVM = rows in host memory, fused_uvm_caching with an HBM cache of hot rows.
# torchrec's other kernels (quant*, key_value / SSD, virtual tables) need set-up recsys does not do.
TRAINING_KERNELS = {"cpu": ["dense", "fused"], "cuda": ["dense", "fused", "fused_uvm", "fused_uvm_caching"]}
CUDA_ONLY_KERNELS = set(TRAINING_KERNELS["cuda"]) - set(TRAINING_KERNELS["cpu"])
# What an empty sharding_types list means: every model-parallel type the device offers
# (data_parallel must be asked for by name: it has no fused optimizer).
MODEL_PARALLEL_TYPES = {
    "cpu": ["table_wise", "column_wise", "table_column_wise"],
    "cuda": ["table_wise", "column_wise", "table_column_wise", "row_wise", "table_row_wise"],
}


@dataclass
class ShardedModel:
    module: DistributedModelParallel
    optimizer: CombinedOptimizer  # fused (already applied in backward) + dense
    dense_optimizer: KeyedOptimizerWrapper  # towers and data_parallel tables
    plan: ShardingPlan

    @property
    def task(self):
        """The training task DMP wraps (recsys.model.task: the loss, the candidate gather)."""
        return self.module.module

    @property
    def two_tower(self):
        """The sharded two-tower model (its forward embeds queries and candidates, for evaluation and export)."""
        return self.task.model


def sparse_fused_params(cfg: SparseOptimConfig) -> dict[str, Any] | None:
    """Settings every table's fbgemm kernel gets beyond the optimizer's own: fbgemm ignores
    weight_decay unless weight_decay_mode says how to apply it (its default is NONE)."""
    return {"weight_decay_mode": WeightDecayMode.L2} if cfg.weight_decay > 0 else None


def sparse_optimizer_kwargs(
    cfg: SparseOptimConfig, device: torch.device
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if cfg.name not in SPARSE_OPTIMIZERS:
        raise ValueError(f"optim.sparse.name={cfg.name!r}: unknown; choose one of {sorted(SPARSE_OPTIMIZERS)}")
    cls, devices = SPARSE_OPTIMIZERS[cfg.name]
    if device.type not in devices:
        raise ValueError(
            f"optim.sparse.name={cfg.name!r} has no fused fbgemm kernel on {device.type}; "
            f"on {device.type} use one of {sorted(n for n, (_, d) in SPARSE_OPTIMIZERS.items() if device.type in d)}"
        )
    if cfg.weight_decay > 0 and device.type == "cpu":
        # measured: with weight_decay_mode=L2 reaching the kernel, fbgemm 1.8's CPU updates are
        # bit-identical with and without weight decay; refuse rather than train without it silently
        raise ValueError(
            f"optim.sparse.weight_decay={cfg.weight_decay}: fbgemm's CPU kernels ignore weight decay; "
            "set it to 0 on CPU (it applies on CUDA)"
        )
    kwargs: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
    if cfg.name != "sgd":
        kwargs["eps"] = cfg.eps
    if cfg.name in ("adam", "partial_rowwise_adam", "lamb", "partial_rowwise_lamb"):
        kwargs.update(beta1=cfg.beta1, beta2=cfg.beta2)
    return cls, kwargs


def planner_constraints(
    cfg: ShardingConfig, device: torch.device, table_names, managed: Collection[str] = ()
) -> dict[str, ParameterConstraints]:
    """Each configured table's constraints; the sequence table (item-sized, a sequence query encoder's) is
    placed like the item table unless sharding.tables.sequence says otherwise. ``managed`` tables
    (model.id_mapping=managed) are row-wise with the fused kernel whatever is configured: the one way torchrec
    shards managed collisions (recsys/distributed/managed.py)."""
    constraints = {
        t: ParameterConstraints(sharding_types=[MANAGED_SHARDING], compute_kernels=["fused"]) for t in managed
    }
    tables = dict(cfg.tables)
    if SEQUENCE_TABLE in table_names and SEQUENCE_TABLE not in tables and "item" in tables:
        tables[SEQUENCE_TABLE] = tables["item"]
    for table, tcfg in tables.items():
        if table in managed:
            continue
        if table not in table_names and table in ALL_TABLES:
            continue  # a table this dataset does not feed (category for items without categories, neighbor when off)
        if table not in table_names:
            raise ValueError(f"sharding.tables.{table}: no such table (tables: {sorted(table_names)})")
        for st in tcfg.sharding_types:
            if st not in {t.value for t in ShardingType}:
                raise ValueError(f"sharding.tables.{table}.sharding_types: unknown type {st!r}")
            if device.type == "cpu" and st not in CPU_SHARDING_TYPES:
                raise ValueError(
                    f"sharding.tables.{table}.sharding_types: {st!r} needs CUDA; on CPU use {sorted(CPU_SHARDING_TYPES)}"
                )
        for kernel in tcfg.compute_kernels:
            if kernel not in {k.value for k in EmbeddingComputeKernel}:
                raise ValueError(f"sharding.tables.{table}.compute_kernels: unknown kernel {kernel!r}")
            if kernel not in TRAINING_KERNELS["cuda"]:
                raise ValueError(
                    f"sharding.tables.{table}.compute_kernels: {kernel!r} is not a training kernel recsys supports; "
                    f"choose from {TRAINING_KERNELS['cuda']}"
                )
            if device.type == "cpu" and kernel in CUDA_ONLY_KERNELS:
                raise ValueError(
                    f"sharding.tables.{table}.compute_kernels: {kernel!r} needs CUDA (UVM); on CPU use 'fused'"
                )
        constraints[table] = ParameterConstraints(
            sharding_types=list(tcfg.sharding_types) or MODEL_PARALLEL_TYPES[device.type],
            compute_kernels=list(tcfg.compute_kernels) or None,
            cache_params=CacheParams(load_factor=tcfg.cache_load_factor) if tcfg.cache_load_factor > 0 else None,
        )
    return constraints


GB = 1024**3  # the planner's "GB", and the unit of hbm_cap_gb / ddr_cap_gb


def host_memory_bytes() -> int:
    """This host's RAM, or the container's memory limit (cgroup v2) when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total


def planner_topology(cfg: ShardingConfig, env: DistEnv) -> Topology:
    """The planner's view of this job's hardware: the devices' and host's real memory unless configured.

    torchrec's own defaults (32 GB of HBM, 128 GB of host memory per rank) would let it plan a
    table that cannot fit, or leave most of an 80 GB GPU unused.
    """
    if cfg.hbm_cap_gb > 0:
        hbm_cap = int(cfg.hbm_cap_gb * GB)
    elif env.device.type == "cuda":
        hbm_cap = torch.cuda.get_device_properties(env.device).total_memory
    else:
        hbm_cap = None  # no HBM on a CPU topology
    ddr_cap = int(cfg.ddr_cap_gb * GB) if cfg.ddr_cap_gb > 0 else host_memory_bytes() // env.local_world_size
    return make_topology(env.world_size, env.local_world_size, env.device.type, hbm_cap=hbm_cap, ddr_cap=ddr_cap)


def make_topology(
    world_size: int, local_world_size: int, compute_device: str, *, hbm_cap: int | None, ddr_cap: int
) -> Topology:
    """A planner Topology through torchrec's factory (it validates the figures; direct construction is deprecated)."""
    return TopologyFactory.create_topology(
        trainer_config=PlannerTrainerConfig(world_size=world_size, local_world_size=local_world_size),
        hardware_config=HardwareConfig(hbm_cap_bytes=hbm_cap, ddr_cap_bytes=ddr_cap),
        kernel_config=KernelConfig(compute_device=compute_device),
    )


def inference_sharding(cfg: ShardingConfig, device: torch.device) -> ShardingConfig:
    """A training run's per-table constraints made valid on ``device``, for loading its weights only.

    On CPU, CUDA-only sharding types (row_wise, ...) and kernels (UVM caching) are dropped, and the
    planner chooses among the rest; DCP reshards the checkpoint into whatever plan results, so a
    run trained on GPUs is evaluated and exported on a CPU machine.
    """
    if device.type == "cuda":
        return cfg
    tables = {
        name: replace(
            table,
            sharding_types=[t for t in table.sharding_types if t in CPU_SHARDING_TYPES],
            compute_kernels=[k for k in table.compute_kernels if k not in CUDA_ONLY_KERNELS],
            cache_load_factor=0.0,
        )
        for name, table in cfg.tables.items()
    }
    return replace(cfg, tables=tables)


@dataclass
class _Tables:
    """The task's tables before sharding: the pooled bags (EBC, and the managed ones), every table's config."""

    bags: dict[str, nn.Module]  # name -> EmbeddingBag (its weight gets the fused optimizer)
    configs: dict[str, Any]  # name -> torchrec EmbeddingBagConfig / EmbeddingConfig
    ec: Any  # the unpooled sequence tables (a sequence query encoder's, e.g. sasrec), or None
    mc: Any  # the managed-collision EBC (model.id_mapping=managed), or None
    managed: list[str]  # the tables behind managed collisions


def _task_tables(task: nn.Module) -> _Tables:
    ebc, ec, mc = task.model.ebc, getattr(task.model, "ec", None), getattr(task.model, "mc_ebc", None)
    bags = dict(ebc.embedding_bags.items()) if ebc is not None else {}
    configs = {c.name: c for c in ebc.embedding_bag_configs()} if ebc is not None else {}
    if ec is not None:  # the unpooled sequence table (a sequence query encoder's)
        configs.update({c.name: c for c in ec.embedding_configs()})
    managed = []
    if mc is not None:  # raw-id tables behind managed collisions (model.id_mapping=managed)
        configs.update({c.name: c for c in mc._embedding_module.embedding_bag_configs()})
        bags.update(mc._embedding_module.embedding_bags.items())
        managed = [c.name for c in mc._embedding_module.embedding_bag_configs()]
    return _Tables(bags, configs, ec, mc, managed)


def _check_table_options(tables: _Tables, pretrained: Mapping[str, str], frozen_tables: Collection[str]) -> None:
    unknown = (set(pretrained) | set(frozen_tables)) - set(tables.configs)
    if unknown:
        raise ValueError(
            f"pretrained / frozen tables {sorted(unknown)} are not in the model ({sorted(set(tables.configs))})"
        )
    by_id = sorted((set(pretrained) | set(frozen_tables)) & set(tables.managed))
    if by_id:
        raise ValueError(
            f"model.tables.{by_id[0]}: pretrained_path / frozen need a row per dataset index; with "
            "model.id_mapping=managed its rows belong to whichever ids hold them"
        )


def _fuse_sparse_optimizer(
    tables: _Tables, sparse: SparseOptimConfig, device: torch.device, frozen_tables: Collection[str]
) -> None:
    """Every table's optimizer, fused into backward (a frozen one's: SGD at lr 0); before planning, which
    counts its state in each shard's storage."""
    opt_cls, opt_kwargs = sparse_optimizer_kwargs(sparse, device)
    for name, bag in tables.bags.items():
        if name in frozen_tables:
            apply_optimizer_in_backward(torch.optim.SGD, [bag.weight], {"lr": 0.0})
        else:
            apply_optimizer_in_backward(opt_cls, [bag.weight], opt_kwargs)
    for embedding in tables.ec.embeddings.values() if tables.ec is not None else ():
        apply_optimizer_in_backward(opt_cls, [embedding.weight], opt_kwargs)


def _sharders(task: nn.Module, tables: _Tables, sparse: SparseOptimConfig, env: DistEnv, seed: int) -> list:
    sharders = [EmbeddingBagCollectionSharder(fused_params=sparse_fused_params(sparse))]
    if tables.ec is not None:
        sharders.append(EmbeddingCollectionSharder(fused_params=sparse_fused_params(sparse)))
    if tables.mc is not None:
        set_buckets(task, env.world_size)
        sharders.append(
            ManagedSharder(EmbeddingBagCollectionSharder(fused_params=sparse_fused_params(sparse)), seed=seed)
        )
    return sharders


def _load_pretrained(
    dmp: DistributedModelParallel,
    readers: Mapping[str, Any],
    tables: _Tables,
    pretrained: Mapping[str, str],
    frozen_tables: Collection[str],
    env: DistEnv,
) -> None:
    for table, read_rows in readers.items():
        load_pretrained_table(dmp, table, read_rows)
        if env.is_main:
            log.info(
                "table %s: %d x %d loaded from %s, %s",
                table,
                tables.configs[table].num_embeddings,
                tables.configs[table].embedding_dim,
                pretrained[table],
                "frozen" if table in frozen_tables else "trainable",
            )


def _dense_optimizer(
    dmp: DistributedModelParallel, dense: DenseOptimConfig, frozen_tables: Collection[str]
) -> KeyedOptimizerWrapper:
    """The towers' optimizer (and any data_parallel table's but a frozen one's)."""
    if dense.name not in DENSE_OPTIMIZERS:
        raise ValueError(f"optim.dense.name={dense.name!r}: unknown; choose one of {sorted(DENSE_OPTIMIZERS)}")
    dense_cls = DENSE_OPTIMIZERS[dense.name]
    dense_params = {
        k: p
        for k, p in in_backward_optimizer_filter(dmp.named_parameters())
        if not any(k.endswith(f".embedding_bags.{t}.weight") for t in frozen_tables)  # a frozen data_parallel table
    }
    return KeyedOptimizerWrapper(
        dense_params, lambda params: dense_cls(params, lr=dense.lr, weight_decay=dense.weight_decay)
    )


def shard_model(
    task: nn.Module,
    *,
    sharding: ShardingConfig,
    sparse: SparseOptimConfig,
    dense: DenseOptimConfig,
    env: DistEnv,
    seed: int,
    pretrained: Mapping[str, str] | None = None,
    frozen_tables: Collection[str] = (),
    batch_size_per_rank: int = 512,
) -> ShardedModel:
    """Plan, shard and initialise ``task`` (whose ``model.ebc`` lives on the meta device).

    Tables are initialised from ``seed`` block by block, so every world size and plan starts
    from the same weights; ``pretrained`` maps a table to a file that replaces that init.
    ``frozen_tables`` get a fused SGD with learning rate 0: their rows never move.
    ``batch_size_per_rank`` (examples) sizes the planner's input / output reservations and perf model.
    """
    pretrained = pretrained or {}
    tables = _task_tables(task)
    _check_table_options(tables, pretrained, frozen_tables)
    _fuse_sparse_optimizer(tables, sparse, env.device, frozen_tables)
    configs = tables.configs
    readers = {
        t: open_pretrained(path, table=t, num_rows=configs[t].num_embeddings, dim=configs[t].embedding_dim)
        for t, path in pretrained.items()
    }  # opened before sharding: a bad file fails fast

    planner = EmbeddingShardingPlanner(
        topology=planner_topology(sharding, env),
        batch_size=batch_size_per_rank,
        constraints=planner_constraints(sharding, env.device, set(configs), tables.managed),
    )
    sharders = _sharders(task, tables, sparse, env, seed)
    pg = dist.GroupMember.WORLD
    plan = planner.collective_plan(task, sharders, pg)
    dmp = DistributedModelParallel(
        task, env=ShardingEnv.from_process_group(pg), device=env.device, plan=plan, sharders=sharders
    )
    if hasattr(dmp.module, "gather_candidates"):  # the in-batch softmax's candidates: every rank's, gathered
        dmp.module.gather_candidates = candidate_gather(env.rank, env.world_size)
    init_tables(dmp, seed=seed)
    zero_managed_tables(dmp)  # their rows are drawn from the ids they admit
    _load_pretrained(dmp, readers, tables, pretrained, frozen_tables, env)
    dense_opt = _dense_optimizer(dmp, dense, frozen_tables)
    return ShardedModel(
        module=dmp, optimizer=CombinedOptimizer([dmp.fused_optimizer, dense_opt]), dense_optimizer=dense_opt, plan=plan
    )
