"""Typed configuration schemas.

Only the entry points (``recsys.train``, ``recsys.evaluate``, ``data_pipelines.prepare``) see a Hydra
``DictConfig``; they turn it into these dataclasses with :func:`to_config`. The schemas are
registered in Hydra's ConfigStore as ``config_schema`` so a typo in any key (``trainer.epoch=3``)
fails at start-up with the key's full path, before any work is done.

Required values are ``???`` (``MISSING``), never ``None``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from data_pipelines.config import InteractionsDataConfig


@dataclass
class SyntheticDataConfig:
    num_users: int = 6040  # users; MovieLens-1M has 6040
    num_items: int = 3706  # items; MovieLens-1M has 3706 rated movies
    num_categories: int = 18  # categories (genres); MovieLens-1M has 18
    num_interactions: int = 1_000_000  # total interactions before the split
    latent_dim: int = 16  # dimension of the planted user / item factors
    min_interactions_per_user: int = 20  # floor on each user's count; MovieLens-1M keeps users with >= 20
    seed: int = 0  # generator seed (the split has its own, data.split_seed)


@dataclass
class MovieLensDataConfig:
    release: str = "ml-1m"  # "ml-100k" | "ml-1m" | "ml-10m" | "ml-20m" | "ml-25m" | "ml-latest-small"
    url: str = ""  # zip fetched when data.root has no copy; "" = https://files.grouplens.org/datasets/movielens/<release>.zip
    md5: str = ""  # expected md5 of a downloaded zip; "" = GroupLens' published one (none for ml-latest-small), "skip" = no check
    download: bool = True  # false: never download; a missing copy is an error saying where to put it


@dataclass
class DataConfig:
    name: str = MISSING  # dataset name, also names the prepared dir ("synthetic", "movielens_1m")
    source: str = "synthetic"  # which pipeline prepares it: "synthetic" | "movielens" | "interactions" (any log, data_pipelines/interactions.py)
    root: str = "data"  # folder for prepared dataset dirs and MovieLens zips / extracted folders (relative to the launch dir)
    protocol: str = "recbole"  # split protocol: "recbole" (random 8:1:1 per user) | "loo" | "strong_generalization" | "given" (interactions only)
    split_seed: int = 0  # seed of the split protocol
    history_length: int = 20  # cap on the items a query's history bag holds (history_item_ids); 0 disables history features
    # which items a training query sees (the protocol's config sets it; README "Query features"):
    # "recent": the history_length items just before the target in time (sequential protocols, loo);
    # "profile": up to history_length of the user's OTHER training items, resampled every epoch, the
    # target never among them (random splits: recbole, given, strong_generalization)
    query_history: str = "recent"
    history_dropout: float = 0.0  # profile: share of the bag left out at random each epoch (training only); 0 keeps min(cap, n - 1)
    min_rating: float = 0.0  # keep interactions rated >= this (stars; 4.0 = Liang's > 3.5 on half stars); 0 keeps all
    min_user_interactions: int = 0  # k-core: users need >= this many interactions after the rating filter; 0 disables
    min_item_interactions: int = 0  # k-core: items need >= this many (iterated with users until stable); 0 disables
    # true: each rank reads only its own users' rows (contiguous user ranges of ~equal training rows)
    # and trains / evaluates on them, instead of every rank holding the whole dataset; the epoch's
    # order then depends on the world size (docs: README "Data across ranks")
    shard_by_user: bool = False
    num_heldout_users: int = 0  # strong_generalization: users in each of valid and test; 0 = 10000 x users / 136677 (Liang's ML-20M share)
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    movielens: MovieLensDataConfig = field(default_factory=MovieLensDataConfig)
    interactions: InteractionsDataConfig = field(default_factory=InteractionsDataConfig)


@dataclass
class TableConfig:
    embedding_dim: int = 64  # columns of the table
    pooling: str = "mean"  # "sum" | "mean": how a bag of ids becomes one vector
    pretrained_path: str = ""  # initial rows from a .npy (num_rows x dim) or parquet (id, vector); "" = random init
    frozen: bool = False  # true: the rows never change (the table's fused optimizer gets lr 0)


@dataclass
class ModelConfig:
    tables: Dict[str, TableConfig] = field(default_factory=dict)  # user / item / category tables
    tower_dims: List[int] = field(default_factory=lambda: [256])  # MLP widths of each tower; last = output dim
    temperature: float = 0.1  # softmax temperature tau: scores are <q, c> / tau
    logq_correction: bool = True  # subtract log q(i), the sampling probability of each candidate
    logq_weight: float = 1.0  # the correction subtracts this times log q(i): 1 = the unbiased estimate, < 1 keeps some popularity
    num_uniform_negatives: int = 0  # extra uniformly sampled candidates shared by the batch; 0 disables
    loss: str = "softmax"  # "softmax": in-batch sampled softmax (temperature, logQ); "ccl": SimpleX's cosine contrastive loss
    margin: float = 0.9  # ccl: negatives with cosine below this cost nothing
    negative_weight: float = 150.0  # ccl: weight of the mean negative term
    # the query tower sees the user-id embedding (true) or its history bag alone (false: no user table
    # is built); null = by data.query_history: false with "profile", true with "recent" (docs/quality.md)
    query_user_id: Optional[bool] = None


@dataclass
class SparseOptimConfig:
    name: str = "rowwise_adagrad"  # fused: "rowwise_adagrad" | "adagrad" | "sgd"; GPU only: "adam" | "partial_rowwise_adam" | "lamb" | "partial_rowwise_lamb"
    lr: float = 0.05  # table learning rate
    eps: float = 1e-8  # Adagrad / Adam epsilon
    beta1: float = 0.9  # Adam / LAMB first-moment decay
    beta2: float = 0.999  # Adam / LAMB second-moment decay
    weight_decay: float = 0.0  # L2 on looked-up rows (CUDA only: fbgemm's CPU kernels ignore it, so CPU runs refuse it); 0 disables


@dataclass
class DenseOptimConfig:
    name: str = "adam"  # tower optimizer: "adam" | "adamw" | "adagrad" | "sgd"
    lr: float = 1e-3  # tower learning rate
    weight_decay: float = 0.0  # 0 disables


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)


@dataclass
class TableShardingConfig:
    sharding_types: List[str] = field(default_factory=list)  # allowed torchrec sharding types; [] = planner decides
    compute_kernels: List[str] = field(default_factory=lambda: ["fused"])  # "fused" | "fused_uvm_caching" (GPU) | "dense"
    cache_load_factor: float = 0.0  # fused_uvm_caching: share of rows cached in HBM; 0 = torchrec's default (0.2)


@dataclass
class ShardingConfig:
    tables: Dict[str, TableShardingConfig] = field(default_factory=dict)  # per-table planner constraints
    device: str = "auto"  # "auto" (cuda if available) | "cpu" | "cuda"
    backend: str = "auto"  # process-group backend: "auto" (nccl on cuda, gloo on cpu) | "gloo" | "nccl"
    hbm_cap_gb: float = 0.0  # GPU memory per device the planner may use, GB (2**30 bytes); 0 = the device's total memory
    ddr_cap_gb: float = 0.0  # host memory per rank the planner may use (CPU tables, UVM), GB; 0 = this host's RAM / local ranks


@dataclass
class TrainerConfig:
    epochs: int = 10  # passes over the training split (upper bound with early stopping)
    global_batch_size: int = 1024  # examples per step summed over all ranks (shares differ by at most one row)
    seed: int = 0  # seeds table / tower init, shuffling and negative sampling
    early_stopping_patience: int = 2  # epochs without a better valid recall@20 before stopping; 0 disables
    log_every_steps: int = 50  # steps between loss / samples-per-second log lines
    progress_bar: bool = True  # tqdm on rank 0
    max_steps_per_epoch: int = 0  # cap on steps per epoch (smoke tests); 0 = the whole epoch
    pipeline: str = "none"  # "none": plain loop | "sparse_dist": torchrec's TrainPipelineSparseDist (next batch's input all-to-all overlaps this step)
    resume: str = "auto"  # "auto": newest complete checkpoint in the run dir, if any | "none": start over | a path
    init_from: str = ""  # a new run starts from these weights (a checkpoint dir, e.g. another run's checkpoints/best): fresh optimizer, step 0; "" = random / pretrained init; a resumed run ignores it
    checkpoint_every_steps: int = 0  # also checkpoint every N steps inside an epoch; 0 = at epoch ends only
    keep_last_checkpoints: int = 2  # step checkpoints kept (the best-epoch weights are kept apart)
    # on SIGTERM (preemption): finish the step, checkpoint, exit with status 75; seconds from the signal to the
    # exit at most (without a checkpoint if it takes longer): keep it below the scheduler's grace; 0 = SIGTERM kills at once
    preemption_grace_s: float = 25.0
    fault_at_step: int = 0  # fault injection for tests: exit(13) after this step on the first attempt; 0 disables
    fault_rank: int = 0  # the rank that fails when fault_at_step is set


@dataclass
class EvalConfig:
    ks: List[int] = field(default_factory=lambda: [10, 20, 50])  # cut-offs reported
    valid_metric: str = "recall@20"  # early-stopping metric, computed on the valid split each epoch
    batch_size: int = 1024  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul in exact top-k


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run_name: str = "default"  # names the run dir: runs/<run_name>


def query_uses_user_id(cfg: Config) -> bool:
    """Whether the query tower sees the user id: ``model.query_user_id``, or by the history choice when null.

    With a profile bag the user-id table overfitted Gowalla within two epochs (valid recall fell from
    epoch 1), while the bag alone kept improving for eight (docs/quality.md)."""
    if cfg.model.query_user_id is not None:
        return cfg.model.query_user_id
    return cfg.data.query_history != "profile" or cfg.data.history_length <= 0


def register_configs() -> None:
    ConfigStore.instance().store(name="config_schema", node=Config)


def reject_unknown_keys(cfg: DictConfig, path: str = "") -> None:
    """Raise on a key no schema declares, e.g. one appended with '+' (``+cluster.hbm_gbb=1``).

    Hydra's ``+`` adds keys even to a structured node, and ``OmegaConf.to_object`` then drops
    them silently; this makes an appended typo fail like a plain one.
    """
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        known = {f.name for f in dataclasses.fields(schema)}
        for key in cfg.keys():
            if key not in known:
                raise ValueError(f"Key '{key}' not in '{schema.__name__}'\n    full_key: {path}{key}")
    for key in cfg.keys():
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            reject_unknown_keys(child, f"{path}{key}.")



def to_config(cfg: DictConfig) -> Config:
    """Validated ``DictConfig`` -> plain dataclasses (raises on missing ``???`` values and unknown keys)."""
    reject_unknown_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ValueError(f"config values required but not set: {', '.join(missing)}")
    obj: Any = OmegaConf.to_object(cfg)
    if not isinstance(obj, Config):
        raise TypeError(f"expected a config built on the 'config_schema' schema, got {type(obj).__name__}")
    check_values(obj)
    return obj


# metric names eval.valid_metric may use, with "@K" for a K in eval.ks (recsys/evaluation/metrics.py)
VALID_METRICS = ("recall", "recall_liang", "ndcg", "hit_rate", "mrr", "coverage")


def check_values(cfg: Config) -> None:
    """Refuse values no run can use, naming the key, before any work (types are Hydra's job)."""
    problems = []

    def need(ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: {rule}")

    t, m, d, e = cfg.trainer, cfg.model, cfg.data, cfg.eval
    need(t.global_batch_size >= 1, "trainer.global_batch_size", t.global_batch_size, "must be >= 1")
    # one candidate makes the softmax loss 0 (nothing is learnt): the batch's positives plus the uniform negatives
    need(t.global_batch_size < 1 or t.global_batch_size + m.num_uniform_negatives >= 2, "trainer.global_batch_size",
         t.global_batch_size, f"in-batch softmax needs >= 2 candidates per step, this leaves "
         f"{t.global_batch_size + m.num_uniform_negatives} (with model.num_uniform_negatives={m.num_uniform_negatives})")
    need(t.epochs >= 1, "trainer.epochs", t.epochs, "must be >= 1")
    need(t.log_every_steps >= 1, "trainer.log_every_steps", t.log_every_steps, "must be >= 1")
    for key in ("early_stopping_patience", "max_steps_per_epoch", "checkpoint_every_steps",
                "keep_last_checkpoints", "fault_at_step"):
        need(getattr(t, key) >= 0, f"trainer.{key}", getattr(t, key), "must be >= 0 (0 disables)")
    need(t.preemption_grace_s >= 0, "trainer.preemption_grace_s", t.preemption_grace_s, "must be >= 0 (0 disables)")
    need(m.temperature > 0, "model.temperature", m.temperature, "must be > 0 (scores are divided by it)")
    need(m.num_uniform_negatives >= 0, "model.num_uniform_negatives", m.num_uniform_negatives, "must be >= 0")
    need(m.loss in ("softmax", "ccl"), "model.loss", m.loss, "must be 'softmax' or 'ccl'")
    need(-1.0 <= m.margin < 1.0, "model.margin", m.margin, "must be a cosine in [-1, 1)")
    need(m.negative_weight >= 0, "model.negative_weight", m.negative_weight, "must be >= 0")
    need(all(w >= 1 for w in m.tower_dims) and len(m.tower_dims) > 0, "model.tower_dims", m.tower_dims, "must be widths >= 1")
    for name, table in m.tables.items():
        need(table.embedding_dim >= 1, f"model.tables.{name}.embedding_dim", table.embedding_dim, "must be >= 1")
        need(table.pooling in ("sum", "mean"), f"model.tables.{name}.pooling", table.pooling, "must be 'sum' or 'mean'")
    need(d.history_length >= 0, "data.history_length", d.history_length, "must be >= 0 (0 disables history)")
    need(d.query_history in ("recent", "profile"), "data.query_history", d.query_history, "must be 'recent' or 'profile'")
    need(0.0 <= d.history_dropout < 1.0, "data.history_dropout", d.history_dropout, "must be in [0, 1)")
    need(len(e.ks) > 0 and all(k >= 1 for k in e.ks), "eval.ks", e.ks, "cut-offs must be >= 1")
    metric, _, k = e.valid_metric.partition("@")
    valid_names = [f"{name}@{k}" for name in VALID_METRICS for k in e.ks]
    need(metric in VALID_METRICS and k.isdigit() and int(k) in e.ks, "eval.valid_metric", e.valid_metric,
         f"choose one of {', '.join(valid_names)}")
    need(e.batch_size >= 1 and e.chunk_size >= 1, "eval.batch_size / eval.chunk_size", (e.batch_size, e.chunk_size), "must be >= 1")
    if problems:
        raise ValueError("bad config values: " + "; ".join(problems))
