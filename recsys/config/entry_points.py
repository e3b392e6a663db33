"""The schemas of the other entry points (``recsys.evaluate``, ``recsys.export``, ``scripts/plan_sharding.py``)
and every schema's registration with Hydra."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from recsys.config.model import ModelConfig, open_components
from recsys.config.run import Config
from recsys.config.training import Device, OptimConfig, ShardingConfig
from recsys.utils.choices import ANN_KINDS


@dataclass
class EvaluateConfig:
    """``python -m recsys.evaluate`` (conf/evaluate.yaml): the run's own data / model come from its checkpoint."""

    run_dir: str = MISSING  # the training run to evaluate (holds .hydra/ and checkpoints/)
    checkpoint: str = ""  # checkpoint dir to load; "" = <run_dir>/checkpoints/best
    ks: list[int] = field(default_factory=lambda: [10, 20, 50, 100])  # cut-offs reported
    splits: list[str] = field(default_factory=lambda: ["valid", "test"])  # evaluated splits (valid tunes EASE)
    # the report's rows beyond the model and popularity, each ranked by the run's evaluation stage (tuned on valid, fit
    # again for test); null: the run's eval.rankers and the registry's report baselines (recsys/rankers/registry.py)
    rankers: list[str] | None = None
    # rankers' settings over the run's eval.settings for this report, by ranker: e.g. settings.ease.lambdas=[300]
    settings: dict[str, Any] = field(default_factory=dict)
    ann_kinds: list[str] = field(default_factory=lambda: list(ANN_KINDS))  # FAISS indexes; [] disables
    max_users: int = (
        0  # users evaluated per split: 0 = all; N = a uniform sample of N (catalogs of 10^8 users), drawn from seed
    )
    # where the report goes; "" = <run_dir>/eval, or <run_dir>/eval_sample_<max_users>_seed_<seed> for a
    # sample (max_users), so that a sampled report never replaces the full one
    out_dir: str = ""
    seed: int = 0  # seed of the user sample (max_users)
    batch_size: int = 4096  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul
    device: Device = Device.auto  # where the model is loaded and embeds; auto = cuda if available


@dataclass
class ExportConfig:
    """``python -m recsys.export`` (conf/export.yaml)."""

    run_dir: str = MISSING  # the training run to export
    checkpoint: str = ""  # checkpoint dir; "" = <run_dir>/checkpoints/best
    # auto: a trainer.refit run's refit (<run_dir>/refit: its test figures are the run's answer), else the run's best
    # epoch | selection: the run's own best epoch (trained on train only) even where it has a refit
    stage: str = "auto"
    out_dir: str = (
        ""  # bundle dir; "" = <run_dir>/export (replaced atomically, and only if it holds a bundle export wrote)
    )
    batch_size: int = 4096  # items embedded per forward pass
    device: Device = Device.auto  # where the tables are loaded to embed the items (the bundle is CPU either way)
    # the FAISS index written with the bundle (bundle.recommend searches it): flat (exact), ivf_flat, hnsw
    index: str = "flat"


@dataclass
class ClusterConfig:
    world_size: int = MISSING  # ranks = devices in the whole cluster
    local_world_size: int = MISSING  # devices per host; must divide world_size
    hbm_gb: float = MISSING  # device memory per device, GB (2**30 bytes)
    ddr_gb: float = MISSING  # host memory per device (the host's RAM / local_world_size), GB
    compute_device: str = "cuda"  # "cuda" | "cpu": which sharding types and kernels the planner may use
    batch_size_per_rank: int = 512  # examples per rank per step, for the planner's perf model and input reservation; 512 = torchrec's default; training plans with trainer.global_batch_size / world_size


@dataclass
class TableRowsConfig:
    user: int = MISSING  # rows of the user table (users)
    item: int = MISSING  # rows of the item table (items)
    category: int = MISSING  # rows of the category table (categories)
    side: dict[str, int] = field(default_factory=dict)  # rows of each table model.features names (ids of its column)


@dataclass
class PlanConfig:
    """``scripts/plan_sharding.py`` (conf/plan.yaml): a planner dry run for a declared cluster."""

    model: ModelConfig = field(default_factory=ModelConfig)  # table dims / poolings and towers (the `model` group)
    sharding: ShardingConfig = field(
        default_factory=ShardingConfig
    )  # per-table constraints (the `sharding` group); its device / backend / hbm_cap_gb / ddr_cap_gb are ignored: the cluster says
    optim: OptimConfig = field(
        default_factory=OptimConfig
    )  # the fused sparse optimizer's state is part of each shard's storage
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # the cluster planned for (the `cluster` group)
    num_rows: TableRowsConfig = field(default_factory=TableRowsConfig)  # rows per table
    history_length: int = (
        20  # as data.history_length: 0 drops the query-side history features (fewer inputs to reserve for)
    )


def register_configs() -> None:
    """Every entry point's schema, by the name its conf/*.yaml lists first; called by each entry point before Hydra runs."""
    store = ConfigStore.instance()
    store.store(name="config_schema", node=schema(Config))
    store.store(name="evaluate_schema", node=EvaluateConfig)
    store.store(name="export_schema", node=ExportConfig)
    store.store(name="plan_schema", node=schema(PlanConfig))


def schema(cls: type) -> DictConfig:
    """The dataclass ``cls`` (with a ``model`` section) as a Hydra schema: its components' sections open."""
    node = OmegaConf.structured(cls)
    open_components(node.model)
    return node
