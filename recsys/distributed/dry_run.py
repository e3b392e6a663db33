"""Planner dry runs: plan the model for a cluster you don't have, allocating nothing.

:func:`plan_dry_run` of a ``recsys.config.PlanConfig`` (conf/plan.yaml), which
``scripts/plan_sharding.py`` calls::

    RetrievalTask(TwoTower) built on the meta device (tables, towers, buffers: no storage)
      -> EmbeddingShardingPlanner(make_topology(world_size, local_world_size, "cuda", hbm_cap, ddr_cap),
                                  constraints from the sharding group).plan(module, sharders)
      -> per table: sharding type, compute kernel, ranks of its shards
         per rank:  HBM / DDR of the shards placed there (the planner's own storage estimates:
                    weights + fused optimizer state + lookup buffers)

No process group: ``planner.plan`` is the single-process half of the ``collective_plan`` that
``shard_model`` calls. The planner sees the same module, sharder, constraints, storage
reservation (torchrec's default: 15% of HBM plus dense parameters and input batches) and fused
sparse optimizer as a real run, so a plan that fits here fits there.

Memory is in GB of 2**30 bytes, the unit torchrec's planner prints and ``hbm_cap_gb`` uses.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import PlannerError, ShardingOption, Stats
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from recsys.config import ClusterConfig, PlanConfig
from recsys.data.features import NEIGHBOR_TABLE, TABLES
from recsys.distributed.sharding import GB, make_topology, planner_constraints, sparse_optimizer_kwargs
from recsys.model.build import build_retrieval_task
from recsys.model.task import RetrievalTask

WHOLE_TABLE_TYPES = {"table_wise", "data_parallel"}  # sharding types that never split a table


@dataclass
class TablePlan:
    num_rows: int
    embedding_dim: int
    sharding_type: str
    compute_kernel: str
    shard_ranks: list[int]  # one entry per shard (a rank may hold several column-wise shards)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self.shard_ranks))


@dataclass
class RankUse:
    hbm_bytes: int = 0
    ddr_bytes: int = 0
    tables: list[str] = field(default_factory=list)


@dataclass
class PlanReport:
    fits: bool
    cluster: ClusterConfig
    table_bytes: dict[str, int]  # weights alone, fp32: rows x dim x 4
    tables: dict[str, TablePlan] = field(default_factory=dict)  # empty when it does not fit
    ranks: list[RankUse] = field(default_factory=list)  # world_size entries when it fits
    usable_hbm_bytes: int | None = None  # per rank, after the planner's reservation
    usable_ddr_bytes: int | None = None
    reason: str = ""  # why it does not fit ("" when it does)

    def summary(self) -> dict:
        """The one-line JSON printed last by scripts/plan_sharding.py."""
        out: dict = {
            "fits": self.fits,
            "tables": {
                name: {
                    "sharding_type": t.sharding_type,
                    "ranks": t.ranks,
                    "compute_kernel": t.compute_kernel,
                    "num_shards": len(t.shard_ranks),
                }
                for name, t in self.tables.items()
            },
            # null when there is no plan (no shard has a rank)
            "max_rank_hbm_gb": round(max(r.hbm_bytes for r in self.ranks) / GB, 3) if self.ranks else None,
            "max_rank_ddr_gb": round(max(r.ddr_bytes for r in self.ranks) / GB, 3) if self.ranks else None,
        }
        if not self.fits:
            out["reason"] = self.reason
        return out


class _LastPlan(Stats):
    """Keeps what the planner hands its stats: the chosen plan (or, failing, the last proposal)."""

    def __init__(self) -> None:
        self.best_plan: list[ShardingOption] | None = None
        self.reserved_topology: Topology | None = None

    def log(
        self,
        sharding_plan,
        topology,
        batch_size,
        storage_reservation,
        num_proposals,
        num_plans,
        run_time,
        best_plan,
        *args,
        **kwargs,
    ) -> None:
        self.best_plan = best_plan
        self.reserved_topology = getattr(storage_reservation, "last_reserved_topology", None)


class _DropDryRunNoise(logging.Filter):
    """torchrec warns, on every plan, about what is expected in a dry run: dense tensors are not
    materialised (their size is still exact: numel x element size works on meta tensors)."""

    PREFIXES = ("There is a known issue with TorchRec's dense tensor",)

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.PREFIXES)


@contextlib.contextmanager
def _quiet_dry_run_noise() -> Iterator[None]:
    noise = _DropDryRunNoise()
    loggers = [logging.getLogger("torchrec.distributed.planner." + m) for m in ("types", "storage_reservations")]
    for lg in loggers:
        lg.addFilter(noise)
    try:
        with warnings.catch_warnings():
            # HeuristicalStorageReservation's FutureWarning: it is what shard_model plans with.
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\.distributed\.planner")
            yield
    finally:
        for lg in loggers:
            lg.removeFilter(noise)


def _check(cfg: PlanConfig) -> None:
    c = cfg.cluster
    if c.world_size < 1 or c.local_world_size < 1 or c.world_size % c.local_world_size:
        raise ValueError(
            f"cluster.world_size={c.world_size} must be a positive multiple of cluster.local_world_size={c.local_world_size}"
        )
    if c.hbm_gb <= 0 or c.ddr_gb < 0:
        raise ValueError(f"cluster.hbm_gb={c.hbm_gb} must be > 0 and cluster.ddr_gb={c.ddr_gb} >= 0")
    if c.batch_size_per_rank < 1:
        raise ValueError(f"cluster.batch_size_per_rank={c.batch_size_per_rank} must be >= 1")
    if c.compute_device not in ("cuda", "cpu"):
        raise ValueError(f"cluster.compute_device={c.compute_device!r}: choose 'cuda' or 'cpu'")
    if str(cfg.model.id_mapping) != "vocab":
        raise ValueError(
            f"model.id_mapping={cfg.model.id_mapping}: the dry run plans vocabulary tables; a managed table is "
            "row-wise over every rank, model.managed.zch_size rows (docs/continuous-training.md)"
        )
    # the neighbour table (data.item_neighbors) may be configured but is not planned here; when on it
    # is another table of num_rows.item rows: size a cluster for it too
    side = side_table_towers(cfg)
    builtin = set(TABLES) | ({NEIGHBOR_TABLE} & set(cfg.model.tables))
    if set(cfg.model.tables) != builtin | set(side):
        raise ValueError(
            f"model.tables: expected {list(TABLES) + list(side)} (and optionally {NEIGHBOR_TABLE!r}), "
            f"got {sorted(cfg.model.tables)}"
        )
    unknown = set(cfg.num_rows.side) - set(side)
    if unknown:
        raise ValueError(f"num_rows.side: {sorted(unknown)} are no table of model.features (tables: {list(side)})")
    for name, rows in table_rows(cfg).items():
        if rows < 1:
            key = name if name in TABLES else f"side.{name}"
            raise ValueError(f"num_rows.{key}={rows} must be >= 1 (every table of model.features needs its rows)")


def side_table_towers(cfg: PlanConfig) -> dict[str, list[str]]:
    """The tables model.features names -> the towers they feed (recsys.model.build's side_towers)."""
    out: dict[str, list[str]] = {}
    for name, feature in cfg.model.features.items():
        out.setdefault(feature.table or name, []).append(feature.tower)
    return out


def table_rows(cfg: PlanConfig) -> dict[str, int]:
    """Rows of every table planned: the built-in ones, then model.features' (num_rows.side; 0 = not given)."""
    rows = {t: getattr(cfg.num_rows, t) for t in TABLES}
    return rows | {t: cfg.num_rows.side.get(t, 0) for t in side_table_towers(cfg)}


def build_meta_task(cfg: PlanConfig) -> RetrievalTask:
    """The training module (towers, tables and the item-probability buffer) on the meta device."""
    if cfg.model.query_encoder.sequence:
        raise ValueError(
            f"model.query_encoder.name={cfg.model.query_encoder.name}: the planner dry run plans the "
            "EmbeddingBagCollection's tables only; plan with model/query_encoder=bag (the sequence table is "
            "item-sized, placed like the item table)"
        )
    return build_retrieval_task(
        cfg.model,
        num_rows=table_rows(cfg),
        history_length=cfg.history_length,
        side_towers=side_table_towers(cfg),
        item_counts=torch.ones(cfg.num_rows.item, device="meta"),
        device=torch.device("meta"),
    )


def _no_plan_reason(cfg: PlanConfig, error: PlannerError, table_bytes: dict[str, int], usable_hbm: int | None) -> str:
    """The planner's verdict, plus which tables are too big for what the cluster offers."""
    c = cfg.cluster
    verdict = str(error).strip().splitlines()[0].strip()
    sizes = ", ".join(
        f"'{t}' {table_bytes[t] / GB:.1f} GB ({table_rows(cfg)[t]} x {cfg.model.tables[t].embedding_dim})"
        for t in sorted(table_bytes, key=table_bytes.get, reverse=True)
    )
    usable = usable_hbm if usable_hbm is not None else int(c.hbm_gb * GB)
    cluster_usable = usable * c.world_size
    parts = [
        f"no plan for {c.world_size} x {c.hbm_gb:g} GB {c.compute_device} "
        f"({usable / GB:.2f} GB usable per rank after the planner's reservation, {cluster_usable / GB:.1f} GB in all)",
        f"tables (fp32 weights alone): {sizes}",
    ]
    too_big = [t for t in table_bytes if table_bytes[t] > cluster_usable]
    if too_big:
        parts.append("larger than the whole cluster: " + ", ".join(f"table '{t}'" for t in too_big))
    elif sum(table_bytes.values()) > cluster_usable:
        parts.append("the tables together are larger than the whole cluster")
    else:
        whole = [
            t
            for t in table_bytes
            if t in cfg.sharding.tables
            and cfg.sharding.tables[t].sharding_types
            and set(cfg.sharding.tables[t].sharding_types) <= WHOLE_TABLE_TYPES
            and table_bytes[t] > usable
        ]
        if whole:
            parts.append(
                "kept whole on one rank by its sharding_types but larger than a rank: "
                + ", ".join(f"table '{t}' {cfg.sharding.tables[t].sharding_types}" for t in whole)
            )
        largest = max(table_bytes, key=table_bytes.get)
        parts.append(
            f"the constraints leave no placement (largest table '{largest}'); allow more sharding types "
            "(row_wise spreads a table over every rank) or add ranks"
        )
    parts.append(f"torchrec: {verdict}")
    return "; ".join(parts)


def plan_dry_run(cfg: PlanConfig) -> PlanReport:
    """Plan ``cfg``'s model for ``cfg.cluster`` on the meta device; no process group, no allocation.

    Returns a report whose ``fits`` is False (with ``reason``) when the planner finds no plan.
    """
    _check(cfg)
    c = cfg.cluster
    device = torch.device(c.compute_device)
    task = build_meta_task(cfg)
    ebc = task.model.ebc
    table_bytes = {t.name: t.num_embeddings * t.embedding_dim * 4 for t in ebc.embedding_bag_configs()}

    # The real run fuses the sparse optimizer before planning; its state is part of each shard's storage.
    opt_cls, opt_kwargs = sparse_optimizer_kwargs(cfg.optim.sparse, device)
    apply_optimizer_in_backward(opt_cls, ebc.parameters(), opt_kwargs)

    last = _LastPlan()
    try:
        plan = _plan(cfg, task, device, set(table_bytes), last)
    except PlannerError as e:
        usable = last.reserved_topology.devices[0].storage.hbm if last.reserved_topology else None
        return PlanReport(
            fits=False,
            cluster=c,
            table_bytes=table_bytes,
            usable_hbm_bytes=usable,
            reason=_no_plan_reason(cfg, e, table_bytes, usable),
        )
    report = PlanReport(fits=True, cluster=c, table_bytes=table_bytes, ranks=[RankUse() for _ in range(c.world_size)])
    _fill_report(report, plan, last, {t.name: t for t in ebc.embedding_bag_configs()})
    return report


def _plan(
    cfg: PlanConfig, task: RetrievalTask, device: torch.device, table_names: set[str], last: _LastPlan
) -> ShardingPlan:
    """The planner's plan for ``cfg.cluster`` (``last`` records its reserved topology and chosen options)."""
    c = cfg.cluster
    with _quiet_dry_run_noise():
        topology = make_topology(
            c.world_size,
            c.local_world_size,
            c.compute_device,
            hbm_cap=int(c.hbm_gb * GB),
            ddr_cap=int(c.ddr_gb * GB),
        )
        planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=c.batch_size_per_rank,
            constraints=planner_constraints(cfg.sharding, device, table_names),
            stats=[last],
            debug=False,
        )
        return planner.plan(task, [EmbeddingBagCollectionSharder()])


def _fill_report(report: PlanReport, plan: ShardingPlan, last: _LastPlan, configs: dict) -> None:
    """Each table's placement and each rank's memory use, from the plan and the planner's chosen options."""
    if last.reserved_topology is not None:
        report.usable_hbm_bytes = last.reserved_topology.devices[0].storage.hbm
        report.usable_ddr_bytes = last.reserved_topology.devices[0].storage.ddr
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            report.tables[name] = TablePlan(
                num_rows=configs[name].num_embeddings,
                embedding_dim=configs[name].embedding_dim,
                sharding_type=ps.sharding_type,
                compute_kernel=ps.compute_kernel,
                shard_ranks=list(ps.ranks or []),
            )
    for option in last.best_plan or []:
        for shard in option.shards:
            use = report.ranks[shard.rank]
            use.hbm_bytes += shard.storage.hbm
            use.ddr_bytes += shard.storage.ddr
            if option.name not in use.tables:
                use.tables.append(option.name)
