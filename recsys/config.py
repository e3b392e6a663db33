"""Typed configuration schemas of every entry point, and their registration with Hydra.

Only the entry points (``recsys.train``, ``recsys.evaluate``, ``recsys.export``,
``scripts/plan_sharding.py``, ``data_pipelines.prepare``) see a Hydra ``DictConfig``; each calls
:func:`register_configs` first and turns the composed config into these dataclasses with
``to_typed`` (:func:`to_config` for the training config, which also checks values). A typo in any
key (``trainer.epoch=3``) or a name outside its set (``data.protocol=lo``) fails at start-up with
the key's full path, before any work is done.

Required values are ``???`` (``MISSING``), never ``None``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from data_pipelines.config import (  # noqa: F401  (re-exported: the data schema is part of Config)
    Choice,
    DataConfig,
    InteractionsDataConfig,
    MovieLensDataConfig,
    Protocol,
    QueryHistory,
    Source,
    SyntheticDataConfig,
    reject_unknown_keys,
    to_typed,
)
from data_pipelines.errors import ConfigError
from recsys.choices import ANN_KINDS, EASE_LAMBDAS
from recsys.lr_schedule import SCHEDULES

log = logging.getLogger(__name__)


class RetrievalLoss(Choice):
    """The training loss of recsys.model.task.RetrievalTask."""

    softmax = "softmax"  # in-batch sampled softmax with temperature and logQ correction
    ccl = "ccl"  # SimpleX's cosine contrastive loss (margin, negative weight)


class QueryEncoderKind(Choice):
    """How the query tower reads the user's history (model.query_encoder)."""

    bag = "bag"  # the mean-pooled bag of history items from the item table (every protocol)
    sasrec = "sasrec"  # SASRec: the recent items in order through transformer blocks (data.query_history=recent)


class SparseOptimizer(Choice):
    """Fused into backward by fbgemm; the Adam / LAMB family has CUDA kernels only."""

    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"
    adam = "adam"
    partial_rowwise_adam = "partial_rowwise_adam"
    lamb = "lamb"
    partial_rowwise_lamb = "partial_rowwise_lamb"


class DenseOptimizer(Choice):
    adam = "adam"
    adamw = "adamw"
    adagrad = "adagrad"
    sgd = "sgd"


class Device(Choice):
    auto = "auto"  # cuda if available
    cpu = "cpu"
    cuda = "cuda"


class Backend(Choice):
    auto = "auto"  # nccl on cuda, gloo on cpu
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class TableConfig:
    embedding_dim: int = 64  # columns of the table
    pooling: str = "mean"  # "sum" | "mean" (POOLINGS): how a bag of ids becomes one vector
    pretrained_path: str = ""  # initial rows from a .npy (num_rows x dim) or parquet (id, vector); "" = random init
    frozen: bool = False  # true: the rows never change (the table's fused optimizer gets lr 0)


@dataclass
class FeatureConfig:
    """A categorical column of users.parquet / items.parquet fed to one tower (recsys/data/side_features.py).

    An items column on the query tower is pooled over the query's history items (as ``category`` is);
    a users column can only feed the query tower. The table's size comes from the dataset dir.
    """

    source: str = MISSING  # "users" | "items": the dataset dir file holding the column
    column: str = MISSING  # integer ids (int64), or several per row (list<int64>); 0.. contiguous, by prepare
    tower: str = "query"  # "query" | "candidate"
    table: str = ""  # the model.tables entry it looks up; "" = its own, named after the feature


@dataclass
class SasrecConfig:
    """model.query_encoder=sasrec: the history's items (oldest -> newest, at most data.history_length) are looked
    up per position in a table of their own (``sequence``: item-sized, fused optimizer like the others), plus a
    learned embedding of each item's recency, and go through pre-LN transformer blocks; the newest item's output
    (a learned vector for a user without history) joins the query tower's other inputs (recsys/model/sequence.py)."""

    dim: int = 64  # columns of the sequence table = the blocks' width
    num_layers: int = 2  # transformer encoder blocks
    num_heads: int = 1  # attention heads per block; must divide dim
    dropout: float = 0.2  # on the inputs and inside each block (SASRec's 0.2 for dense data); 0 disables


class IdMapping(Choice):
    """How user / item ids reach their tables (model.id_mapping; docs/continuous-training.md)."""

    vocab = "vocab"  # the dataset dir's contiguous indices: one row per id the vocabulary holds
    managed = "managed"  # raw 64-bit ids through torchrec's managed-collision modules: zch_size rows, evicted by policy


class EvictionPolicy(Choice):
    """Which ids a full managed table gives up for new ones (torchrec's MCH eviction policies)."""

    lru = "lru"  # least recently seen first (LRU_EvictionPolicy)
    lfu = "lfu"  # least often seen first (LFU_EvictionPolicy); new ids rarely win against old counts
    distance_lfu = "distance_lfu"  # counts / (steps since last seen)^decay_exponent (DistanceLFU_EvictionPolicy)


@dataclass
class ManagedConfig:
    """model.id_mapping=managed: the user and item tables (and the neighbour table, keyed by item ids) take raw ids
    through torchrec's MCHManagedCollisionModule (recsys/model/managed.py). A table keeps at most zch_size - 1 ids
    (its last row is the shared row of ids it does not hold); a new id is admitted at the step it is first trained
    on, replacing the policy's least valuable id when the table is full; an admitted row is re-initialised from the
    id (and its optimizer state zeroed). Category and side-feature tables stay vocabulary tables."""

    # rows per managed table ("user", "item"; "neighbor" uses item's); divisible by the number of ranks
    zch_size: dict[str, int] = field(default_factory=lambda: {"user": 65536, "item": 65536})
    eviction_policy: EvictionPolicy = EvictionPolicy.lru  # which held id gives up its row when a new one arrives
    # training steps between admissions / evictions; 1 = every step (an id gets its row the step it is first seen;
    # with more, ids seen in between share the last row until then)
    eviction_interval: int = 1
    decay_exponent: float = 1.0  # lru / distance_lfu: how fast the value of an unseen id decays with its age in steps


@dataclass
class ModelConfig:
    tables: dict[str, TableConfig] = field(default_factory=dict)  # user / item / category tables + side tables
    # side features by name, beside the built-in user / item / category ones; {} = none (today's model)
    features: dict[str, FeatureConfig] = field(default_factory=dict)
    tower_dims: list[int] = field(default_factory=lambda: [256])  # MLP widths of each tower; last = output dim
    temperature: float = 0.1  # softmax temperature tau: scores are <q, c> / tau
    logq_correction: bool = True  # subtract log q(i), the sampling probability of each candidate
    # the correction subtracts this times log q(i): 1 = the unbiased estimate; w shifts the learned
    # scores by (w - 1) log q(i), so < 1 favours tail items and > 1 head items (Gowalla: 1 won both ways)
    logq_weight: float = 1.0
    num_uniform_negatives: int = 0  # extra uniformly sampled candidates shared by the batch; 0 disables
    loss: RetrievalLoss = (
        RetrievalLoss.softmax
    )  # softmax: in-batch sampled softmax (temperature, logQ); ccl: SimpleX's cosine contrastive loss
    margin: float = 0.9  # ccl: negatives with cosine below this cost nothing
    negative_weight: float = 150.0  # ccl: weight of the mean negative term
    # the query tower sees the user-id embedding (true) or its history bag alone (false: no user table
    # is built); null = by data.query_history: false with "profile", true with "recent" (docs/quality.md)
    query_user_id: bool | None = None
    # the query also pools its history bag through the neighbour table (the table of the candidates'
    # co-occurrence neighbours), so a history item meets a candidate's neighbours in one space: an
    # item-kNN-like term at the cost of one more bag lookup per query (chosen on Gowalla: docs/quality.md).
    # null = whenever that table exists (data.item_neighbors > 0) and the query pools a history bag
    query_neighbors: bool | None = None
    # how the query reads its history: bag (the mean-pooled item bag) | sasrec (the recent items in order through
    # transformer blocks, model.sasrec; needs data.query_history=recent)
    query_encoder: QueryEncoderKind = QueryEncoderKind.bag
    sasrec: SasrecConfig = field(default_factory=SasrecConfig)  # model.query_encoder=sasrec only
    # vocab: the user / item tables have a row per dataset index; managed: raw 64-bit ids, model.managed
    id_mapping: IdMapping = IdMapping.vocab
    managed: ManagedConfig = field(default_factory=ManagedConfig)  # model.id_mapping=managed only


@dataclass
class SparseOptimConfig:
    name: SparseOptimizer = (
        SparseOptimizer.rowwise_adagrad
    )  # fused: rowwise_adagrad | adagrad | sgd; GPU only: adam | partial_rowwise_adam | lamb | partial_rowwise_lamb
    lr: float = 0.05  # table learning rate
    eps: float = 1e-8  # Adagrad / Adam epsilon
    beta1: float = 0.9  # Adam / LAMB first-moment decay
    beta2: float = 0.999  # Adam / LAMB second-moment decay
    weight_decay: float = (
        0.0  # L2 on looked-up rows (CUDA only: fbgemm's CPU kernels ignore it, so CPU runs refuse it); 0 disables
    )


@dataclass
class DenseOptimConfig:
    name: DenseOptimizer = DenseOptimizer.adam  # tower optimizer
    lr: float = 3e-4  # tower learning rate (chosen on Gowalla: docs/quality.md)
    weight_decay: float = 0.0  # 0 disables


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)  # fused into backward for every sharded table
    # the towers' optimizer (and that of any data_parallel table, which has no fused kernel)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    # both optimizers' learning rates over training (recsys/lr_schedule.py): "constant" | "linear" (down to 0
    # at the horizon); the horizon is optim.schedule_epochs, 0 = trainer.epochs (a refit keeps its selection's)
    schedule: str = "constant"
    schedule_epochs: int = 0  # the schedule's horizon in epochs; 0 = trainer.epochs


@dataclass
class TableShardingConfig:
    sharding_types: list[str] = field(default_factory=list)  # allowed torchrec sharding types; [] = planner decides
    compute_kernels: list[str] = field(
        default_factory=lambda: ["fused"]
    )  # "fused" | "fused_uvm_caching" (GPU) | "dense"
    cache_load_factor: float = 0.0  # fused_uvm_caching: share of rows cached in HBM; 0 = torchrec's default (0.2)


@dataclass
class ShardingConfig:
    tables: dict[str, TableShardingConfig] = field(default_factory=dict)  # per-table planner constraints
    device: Device = Device.auto  # where tables and towers live; auto = cuda if available
    backend: Backend = Backend.auto  # process-group backend
    hbm_cap_gb: float = (
        0.0  # GPU memory per device the planner may use, GB (2**30 bytes); 0 = the device's total memory
    )
    ddr_cap_gb: float = (
        0.0  # host memory per rank the planner may use (CPU tables, UVM), GB; 0 = this host's RAM / local ranks
    )


@dataclass
class TrainerConfig:
    epochs: int = 10  # passes over the training split (upper bound with early stopping)
    global_batch_size: int = 1024  # examples per step summed over all ranks (shares differ by at most one row)
    seed: int = 0  # seeds table / tower init, shuffling and negative sampling
    early_stopping_patience: int = 2  # epochs without a better valid recall@20 before stopping; 0 disables
    log_every_steps: int = 100  # steps between loss / samples-per-second log lines
    progress_bar: bool = True  # tqdm on rank 0
    max_steps_per_epoch: int = 0  # cap on steps per epoch (smoke tests); 0 = the whole epoch
    pipeline: str = "none"  # one of PIPELINES: "none": plain loop | "sparse_dist": torchrec's TrainPipelineSparseDist (next batch's input all-to-all overlaps this step)
    resume: str = "auto"  # "auto": newest complete checkpoint in the run dir, if any | "none": start over | a path
    init_from: str = ""  # a new run starts from these weights (a checkpoint dir, e.g. another run's checkpoints/best, or a run dir: its newest step checkpoint): fresh optimizer unless init_optimizer, step 0; "" = random / pretrained init; a resumed run ignores it
    init_optimizer: bool = False  # true: init_from's optimizer state too (a step checkpoint's: the incremental runs of docs/continuous-training.md)
    checkpoint_every_steps: int = 0  # also checkpoint every N steps inside an epoch; 0 = at epoch ends only
    keep_last_checkpoints: int = 2  # step checkpoints kept (the best-epoch weights are kept apart)
    # on SIGTERM (preemption): finish the step, checkpoint, exit with status 75; seconds from the signal to the
    # exit at most (without a checkpoint if it takes longer): keep it below the scheduler's grace; 0 = SIGTERM kills at once
    preemption_grace_s: float = 25.0
    fault_at_step: int = 0  # fault injection for tests: exit(13) after this step on the first attempt; 0 disables
    fault_rank: int = 0  # the rank that fails when fault_at_step is set
    # true: after early stopping, a fresh model is trained on train + valid for the best epoch + 1 epochs
    # (data.train_on_valid) in <run dir>/refit and tested; its test figures are the run's answer
    refit: bool = False
    # "fp32" | "bf16" | "auto": the training step's towers and softmax matmuls in bfloat16 under autocast (fp32
    # accumulation, the softmax and every weight and optimizer state in fp32; evaluation in fp32). bf16 pays only
    # with native bf16 GEMMs (AVX512-BF16 / AMX CPUs, Ampere+ GPUs): a CPU without them emulates it, far slower
    # than fp32. "auto": bf16 where the device has them, else fp32 (the log says which)
    precision: str = "fp32"


@dataclass
class GraphFilterConfig:
    """The ``graph_filter`` ranker (recsys/rankers/graph_filter.py): GF-CF's filter sharpened as BSPM, over the top
    ``rank`` eigenpairs of the user-item graph, so that it is a dot product the serving bundle ships."""

    alphas: list[float] = field(default_factory=lambda: [0.1, 0.2])  # weights of the low-pass filter, chosen on valid
    # BSPM's sharpening times (one RK4 step of dU/dt = -U R~'R~; 0: GF-CF unsharpened), chosen on valid; BSPM's
    # 2.5 won over 0 on every Gowalla grid (docs/quality.md)
    sharpen: list[float] = field(default_factory=lambda: [2.5])
    rank: int = 2048  # eigenpairs of R~'R~ the linear filter keeps: the width of its query / item vectors
    low_rank: int = 256  # eigenvectors of the ideal low-pass filter (GF-CF's 256), among the rank kept
    iterations: int = 3  # subspace iterations of the randomized eigensolver (each one pass over the interactions)
    oversample: int = 64  # extra columns the eigensolver carries beyond rank (accuracy of the last eigenpairs)


@dataclass
class FusionConfig:
    """Every fusion ranker ``first+second`` (recsys/rankers/fusion.py): its parts' spread-normalised scores added."""

    # weights of the second part, chosen on valid (0: the first alone)
    betas: list[float] = field(default_factory=lambda: [0.0, 0.05, 0.1, 0.2])


@dataclass
class EvalConfig:
    ks: list[int] = field(default_factory=lambda: [10, 20, 50])  # cut-offs reported
    valid_metric: str = "recall@20"  # early-stopping metric, computed on the valid split each epoch
    batch_size: int = 1024  # users / items embedded per forward pass
    chunk_size: int = 4096  # query rows per chunked score matmul in exact top-k
    # rankers of the evaluation stage after training (recsys/rankers: two_tower, popularity, graph_filter, and
    # fusions "a+b"); null: two_tower and popularity, with two_tower+graph_filter where the query is a profile bag
    # over a co-occurrence graph (data.item_neighbors > 0), as resolved and logged at the start of the run
    rankers: list[str] | None = None
    # the ranker results.json's headline and recsys.export's bundle are (servable, among the rankers); "": the
    # last servable one of ``rankers``
    serve: str = ""
    # the graph_filter ranker's settings, alone or as a part of a fusion
    graph_filter: GraphFilterConfig = field(default_factory=GraphFilterConfig)
    fusion: FusionConfig = field(default_factory=FusionConfig)  # every fusion ranker "a+b"


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)  # the dataset and its split: groups data, data/protocol
    model: ModelConfig = field(default_factory=ModelConfig)  # tables, features, towers, loss: group model
    optim: OptimConfig = field(default_factory=OptimConfig)  # the tables' and the towers' optimizers: optim/*
    sharding: ShardingConfig = field(default_factory=ShardingConfig)  # where tables go: group sharding
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # the training loop: group trainer
    eval: EvalConfig = field(default_factory=EvalConfig)  # validation and the evaluation stage: group eval
    run_name: str = "default"  # names the run dir: runs/<run_name>


def query_uses_user_id(cfg: Config) -> bool:
    """Whether the query tower sees the user id: ``model.query_user_id``, or by the history choice when null.

    With a profile bag the user-id table overfitted Gowalla within two epochs (valid recall fell from
    epoch 1), while the bag alone kept improving for eight (docs/quality.md)."""
    if cfg.model.query_user_id is not None:
        return cfg.model.query_user_id
    return cfg.data.query_history != "profile" or cfg.data.history_length <= 0


FUSED_RANKER = "two_tower+graph_filter"  # the two-tower fused with the graph filter (recsys/rankers/fusion.py)


def resolved_rankers(cfg: Config) -> list[str]:
    """``eval.rankers``, or when null: the two-tower and popularity, and the two-tower fused with the graph
    filter where the data is a profile-bag graph (data.item_neighbors > 0: the random-split protocols) and the ids
    are the vocabulary's, outside data.slices; the run logs what this gave (recsys.run)."""
    if cfg.eval.rankers is not None:
        return list(cfg.eval.rankers)
    # not with managed ids, nor data.slices (nothing held out to tune its grid on): docs/continuous-training.md
    fused = cfg.data.item_neighbors > 0 and cfg.model.id_mapping == IdMapping.vocab and not cfg.data.slices
    return ["two_tower", "popularity"] + ([FUSED_RANKER] if fused else [])


def served_ranker(cfg: Config) -> str:
    """The ranker results.json's headline and recsys.export's bundle are: ``eval.serve``, else the last servable
    one of the resolved rankers (servable: two_tower, graph_filter and their fusions)."""
    if cfg.eval.serve:
        return cfg.eval.serve
    servable = [n for n in resolved_rankers(cfg) if all(p in SERVABLE_RANKERS for p in n.split("+"))]
    return servable[-1] if servable else "two_tower"


SERVABLE_RANKERS = ("two_tower", "graph_filter")  # dot products the bundle can ship (recsys/bundle_writer.py)


def uses_sequence_encoder(cfg: Config) -> bool:
    """Whether the query reads its history through the SASRec encoder (a ``sequence`` KJT key and table)."""
    return cfg.model.query_encoder == QueryEncoderKind.sasrec


def query_uses_neighbors(cfg: Config) -> bool:
    """Whether the query pools its history bag through the neighbour table too: ``model.query_neighbors``, or
    whenever there is such a table and a pooled history bag when null."""
    if cfg.model.query_neighbors is not None:
        return cfg.model.query_neighbors
    return cfg.data.item_neighbors > 0 and cfg.data.history_length > 0 and not uses_sequence_encoder(cfg)


def query_layout(cfg: Config) -> dict[str, bool]:
    """What the query rows of a batch carry (keyword arguments of recsys.data.batches' FeatureBuilder and
    TrainBatches): the user id, the history as a sequence, the history bag through the neighbour table."""
    return {
        "user_id": query_uses_user_id(cfg),
        "sequence": uses_sequence_encoder(cfg),
        "query_neighbors": query_uses_neighbors(cfg),
    }


# Two names checked by check_values rather than typed as enums: their refusals say which values are allowed
# in the words users already know (and "none" would be no good enum member name for Hydra's parser).
PIPELINES = ("none", "sparse_dist")  # trainer.pipeline
PRECISIONS = ("fp32", "bf16", "auto")  # trainer.precision
POOLINGS = ("sum", "mean")  # model.tables.<name>.pooling
FEATURE_SOURCES = ("users", "items")  # model.features.<name>.source
TOWERS = ("query", "candidate")  # model.features.<name>.tower
# metric names eval.valid_metric may use, with "@K" for a K in eval.ks (recsys/evaluation/metrics.py)
VALID_METRICS = ("recall", "recall_liang", "ndcg", "hit_rate", "mrr", "coverage")


def check_values(cfg: Config) -> None:
    """Refuse values no run can use, naming the key, before any work (types are Hydra's job)."""
    cfg = resolve_protocol(cfg)[0]  # the values a run would use
    problems = []

    def need(ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: {rule}")

    t, m, d, e, o = cfg.trainer, cfg.model, cfg.data, cfg.eval, cfg.optim
    need(t.global_batch_size >= 1, "trainer.global_batch_size", t.global_batch_size, "must be >= 1")
    # one candidate makes the softmax loss 0 (nothing is learnt): the batch's positives plus the uniform negatives
    need(
        t.global_batch_size < 1 or t.global_batch_size + m.num_uniform_negatives >= 2,
        "trainer.global_batch_size",
        t.global_batch_size,
        f"in-batch softmax needs >= 2 candidates per step, this leaves "
        f"{t.global_batch_size + m.num_uniform_negatives} (with model.num_uniform_negatives={m.num_uniform_negatives})",
    )
    need(t.epochs >= 1, "trainer.epochs", t.epochs, "must be >= 1")
    need(
        not (t.refit and d.train_on_valid),
        "trainer.refit",
        t.refit,
        "the refit is the second stage trainer.refit runs itself with data.train_on_valid=true: set one of the two",
    )
    need(
        not ((t.refit or d.train_on_valid) and d.protocol == Protocol.strong_generalization),
        "trainer.refit" if t.refit else "data.train_on_valid",
        True,
        "strong_generalization's valid users are held out (their rows are never training examples): "
        "there is nothing to refit on",
    )
    need(o.schedule in SCHEDULES, "optim.schedule", o.schedule, f"expected one of {', '.join(SCHEDULES)}")
    need(o.schedule_epochs >= 0, "optim.schedule_epochs", o.schedule_epochs, "must be >= 0 (0: trainer.epochs)")
    need(t.precision in PRECISIONS, "trainer.precision", t.precision, f"expected one of {', '.join(PRECISIONS)}")
    need(t.log_every_steps >= 1, "trainer.log_every_steps", t.log_every_steps, "must be >= 1")
    for key in (
        "early_stopping_patience",
        "max_steps_per_epoch",
        "checkpoint_every_steps",
        "keep_last_checkpoints",
        "fault_at_step",
    ):
        need(getattr(t, key) >= 0, f"trainer.{key}", getattr(t, key), "must be >= 0 (0 disables)")
    need(t.preemption_grace_s >= 0, "trainer.preemption_grace_s", t.preemption_grace_s, "must be >= 0 (0 disables)")
    need(m.temperature > 0, "model.temperature", m.temperature, "must be > 0 (scores are divided by it)")
    need(m.num_uniform_negatives >= 0, "model.num_uniform_negatives", m.num_uniform_negatives, "must be >= 0")
    need(-1.0 <= m.margin < 1.0, "model.margin", m.margin, "must be a cosine in [-1, 1)")
    need(m.negative_weight >= 0, "model.negative_weight", m.negative_weight, "must be >= 0")
    need(
        all(w >= 1 for w in m.tower_dims) and len(m.tower_dims) > 0,
        "model.tower_dims",
        m.tower_dims,
        "must be widths >= 1",
    )
    for name, table in m.tables.items():
        need(table.embedding_dim >= 1, f"model.tables.{name}.embedding_dim", table.embedding_dim, "must be >= 1")
        need(table.pooling in POOLINGS, f"model.tables.{name}.pooling", table.pooling, "must be 'sum' or 'mean'")
    for name, feature in m.features.items():
        key = f"model.features.{name}"
        need(feature.source in FEATURE_SOURCES, f"{key}.source", feature.source, "expected 'users' or 'items'")
        need(feature.tower in TOWERS, f"{key}.tower", feature.tower, "expected 'query' or 'candidate'")
        need(
            not (feature.source == "users" and feature.tower == "candidate"),
            f"{key}.tower",
            feature.tower,
            "a users column can only feed the query tower (a candidate is an item)",
        )
        need(
            not (feature.source == "items" and feature.tower == "query" and d.history_length <= 0),
            f"{key}.tower",
            feature.tower,
            "an items column on the query tower is pooled over the history items: needs data.history_length > 0",
        )
        table = feature.table or name
        need(
            table in m.tables,
            f"{key}.table",
            table,
            f"no such table in model.tables ({', '.join(sorted(m.tables))}); add model.tables.{table}",
        )
    need(d.history_length >= 0, "data.history_length", d.history_length, "must be >= 0 (0 disables history)")
    rankers = resolved_rankers(cfg)
    need(len(rankers) > 0 and "two_tower" in rankers, "eval.rankers", rankers, "must list two_tower (what was trained)")
    serve = served_ranker(cfg)
    need(
        serve in rankers and all(p in SERVABLE_RANKERS for p in serve.split("+")),
        "eval.serve",
        serve,
        f"must be one of eval.rankers ({', '.join(rankers)}) made of {' / '.join(SERVABLE_RANKERS)}",
    )
    gfc = cfg.eval.graph_filter
    for key, values in (
        ("graph_filter.alphas", gfc.alphas),
        ("fusion.betas", cfg.eval.fusion.betas),
        ("graph_filter.sharpen", gfc.sharpen),
    ):
        need(
            len(values) > 0 and all(v >= 0 for v in values),
            f"eval.{key}",
            list(values),
            "must be a non-empty list of values >= 0",
        )
    for key in ("rank", "low_rank", "iterations"):
        need(getattr(gfc, key) >= 1, f"eval.graph_filter.{key}", getattr(gfc, key), "must be >= 1")
    need(gfc.oversample >= 0, "eval.graph_filter.oversample", gfc.oversample, "must be >= 0")
    need(t.pipeline in PIPELINES, "trainer.pipeline", t.pipeline, "expected 'none' or 'sparse_dist'")
    need(0.0 <= d.history_dropout < 1.0, "data.history_dropout", d.history_dropout, "must be in [0, 1)")
    need(d.item_neighbors >= 0, "data.item_neighbors", d.item_neighbors, "must be >= 0 (0 disables the feature)")
    need(
        d.item_neighbors == 0 or "neighbor" in m.tables,
        "data.item_neighbors",
        d.item_neighbors,
        "needs a table model.tables.neighbor (embedding_dim, pooling)",
    )
    if m.query_neighbors:
        need(
            d.item_neighbors > 0 and d.history_length > 0 and m.query_encoder == QueryEncoderKind.bag,
            "model.query_neighbors",
            m.query_neighbors,
            "pools the query's history bag through the neighbour table: needs data.item_neighbors > 0, "
            f"data.history_length > 0 and model.query_encoder=bag (got {d.item_neighbors}, {d.history_length}, "
            f"{str(m.query_encoder)}); null turns it on where it applies",
        )
    if m.query_encoder == QueryEncoderKind.sasrec:
        need(
            d.query_history == "recent" and d.history_length > 0,
            "model.query_encoder",
            str(m.query_encoder),
            f"reads the history in time order: needs data.query_history=recent and data.history_length > 0 "
            f"(got data.query_history={str(d.query_history)!r}, data.history_length={d.history_length})",
        )
        sq = m.sasrec
        need(sq.dim >= 1, "model.sasrec.dim", sq.dim, "must be >= 1")
        need(sq.num_layers >= 1, "model.sasrec.num_layers", sq.num_layers, "must be >= 1")
        need(
            sq.num_heads >= 1 and sq.dim % max(sq.num_heads, 1) == 0,
            "model.sasrec.num_heads",
            sq.num_heads,
            f"must be >= 1 and divide model.sasrec.dim={sq.dim}",
        )
        need(0.0 <= sq.dropout < 1.0, "model.sasrec.dropout", sq.dropout, "must be in [0, 1)")
    need(len(e.ks) > 0 and all(k >= 1 for k in e.ks), "eval.ks", e.ks, "cut-offs must be >= 1")
    metric, _, k = e.valid_metric.partition("@")
    valid_names = [f"{name}@{k}" for name in VALID_METRICS for k in e.ks]
    need(
        metric in VALID_METRICS and k.isdigit() and int(k) in e.ks,
        "eval.valid_metric",
        e.valid_metric,
        f"choose one of {', '.join(valid_names)}",
    )
    need(
        e.batch_size >= 1 and e.chunk_size >= 1,
        "eval.batch_size / eval.chunk_size",
        (e.batch_size, e.chunk_size),
        "must be >= 1",
    )
    _check_continuous(cfg, need)
    if problems:
        raise ConfigError("bad config values: " + "; ".join(problems))


def _check_continuous(cfg: Config, need) -> None:
    """model.id_mapping=managed and data.slices (docs/continuous-training.md): values no run can use."""
    m, d, t = cfg.model, cfg.data, cfg.trainer
    if m.id_mapping == IdMapping.managed:
        mc = m.managed
        for table in ("user", "item"):
            size = mc.zch_size.get(table, 0)
            need(size >= 2, f"model.managed.zch_size.{table}", size, "must be >= 2 (the last row is the shared one)")
        extra = sorted(set(mc.zch_size) - {"user", "item"})
        need(not extra, "model.managed.zch_size", dict(mc.zch_size), "has entries for user and item only")
        need(mc.eviction_interval >= 1, "model.managed.eviction_interval", mc.eviction_interval, "must be >= 1")
        need(mc.decay_exponent > 0, "model.managed.decay_exponent", mc.decay_exponent, "must be > 0")
        need(
            not d.shard_by_user,
            "data.shard_by_user",
            d.shard_by_user,
            "model.id_mapping=managed shards its tables row-wise, which needs equal rows per rank in every batch",
        )
        need(
            m.query_encoder == QueryEncoderKind.bag,
            "model.query_encoder",
            str(m.query_encoder),
            "model.id_mapping=managed has no managed sequence table yet: use model.query_encoder=bag",
        )
    if d.slices:
        need(d.slices >= 2, "data.slices", d.slices, "must be 0 (off) or >= 2 (a slice and the next one to test on)")
        need(
            0 <= d.slice <= d.slices - 2,
            "data.slice",
            d.slice,
            f"must be in 0..{d.slices - 2}: each slice is tested on the next one of data.slices={d.slices}",
        )
        need(d.slice_window >= 0, "data.slice_window", d.slice_window, "must be >= 0 (0: every slice so far)")
        need(
            d.train_on_valid,
            "data.train_on_valid",
            d.train_on_valid,
            f"data.slices={d.slices} holds nothing out for validation (a slice is tested on the next one): set "
            "data.train_on_valid=true, or +experiment=daily",
        )
        need(not d.shard_by_user, "data.shard_by_user", d.shard_by_user, "is not supported with data.slices")
        need(
            d.protocol != Protocol.strong_generalization,
            "data.protocol",
            str(d.protocol),
            "data.slices re-splits the whole log by time: use recbole or loo",
        )
        need(not t.refit, "trainer.refit", t.refit, "data.slices trains each slice for trainer.epochs: no refit")


# eval keys of runs from before the rankers (the dense graph filter's): evaluation settings, not the weights'
RETIRED_KEYS = {"eval.graph_filter": ("enabled", "betas", "max_pairs", "memory_gb")}


def drop_retired_keys(saved_cfg) -> None:
    """Remove keys an older run's config holds that this code no longer has (none changes what was trained)."""
    for section, keys in RETIRED_KEYS.items():
        node = OmegaConf.select(saved_cfg, section)
        if node is not None:
            for key in keys:
                node.pop(key, None)


def read_config_file(path) -> Config:
    """A run's saved config (.hydra/config.yaml or a checkpoint's config.yaml), as this code reads it."""
    saved_cfg = OmegaConf.load(path)
    if "model" in saved_cfg and "query_neighbors" not in saved_cfg.model:
        # written before model.query_neighbors existed: those models' queries did not read the neighbour table
        saved_cfg.model.query_neighbors = False
    drop_retired_keys(saved_cfg)
    return to_config(OmegaConf.merge(OmegaConf.structured(Config), saved_cfg))


# What each split protocol implies for the query's features when the data config leaves them null: the one
# place a protocol reaches the model (the split protocols' own files hold split settings only).
_PROFILE_BAG = {
    "query_history": QueryHistory.profile,
    "history_length": 200,
    "history_dropout": 0.25,
    "item_neighbors": 20,
}
PROTOCOL_QUERY: dict[Protocol, dict[str, Any]] = {
    # random held-out items: a bag of the user's other training items (a cap of 200 holds most users' whole
    # profile), a quarter of it left out per example, and each candidate's 20 co-occurrence neighbours
    Protocol.recbole: _PROFILE_BAG,
    Protocol.given: _PROFILE_BAG,
    Protocol.strong_generalization: _PROFILE_BAG,
    # the next item follows the history in time: the 20 items just before the target, no neighbours (not
    # measured on a temporal split; the sequence is this protocol's signal)
    Protocol.loo: {
        "query_history": QueryHistory.recent,
        "history_length": 20,
        "history_dropout": 0.0,
        "item_neighbors": 0,
    },
}


def resolve_protocol(cfg: Config) -> tuple[Config, dict[str, Any]]:
    """``cfg`` with the data fields left null taken from ``PROTOCOL_QUERY[data.protocol]``, and those values."""
    implied = PROTOCOL_QUERY[cfg.data.protocol]
    filled = {key: value for key, value in implied.items() if getattr(cfg.data, key) is None}
    return (replace(cfg, data=replace(cfg.data, **filled)) if filled else cfg), filled


def describe_query(cfg: Config, filled: dict[str, Any] | None = None) -> str:
    """One line: the query and candidate features a resolved config trains, and which came from the protocol."""
    d = cfg.data
    if d.history_length == 0:
        query = "no history"
    elif d.query_history == QueryHistory.profile:
        query = f"a profile bag of up to {d.history_length} of the user's other training items (dropout {d.history_dropout:g})"
    else:
        query = f"the {d.history_length} items just before the target"
    candidate = f"the item and its {d.item_neighbors} co-occurrence neighbours" if d.item_neighbors else "the item"
    source = f"; from the protocol: {', '.join(f'data.{k}' for k in filled)}" if filled else ""
    return f"query: {query}; candidate: {candidate} (protocol {str(d.protocol)}{source})"


def to_config(cfg: DictConfig) -> Config:
    """The training config: ``to_typed`` on the ``Config`` schema, the protocol's query features resolved (and
    logged), then the values checked."""
    obj, filled = resolve_protocol(to_typed(cfg, Config))
    if filled:
        log.info("%s", describe_query(obj, filled))
    check_values(obj)
    return obj


@dataclass
class EvaluateConfig:
    """``python -m recsys.evaluate`` (conf/evaluate.yaml): the run's own data / model come from its checkpoint."""

    run_dir: str = MISSING  # the training run to evaluate (holds .hydra/ and checkpoints/)
    checkpoint: str = ""  # checkpoint dir to load; "" = <run_dir>/checkpoints/best
    ks: list[int] = field(default_factory=lambda: [10, 20, 50, 100])  # cut-offs reported
    splits: list[str] = field(default_factory=lambda: ["valid", "test"])  # evaluated splits (valid tunes EASE)
    ease: bool = True  # EASE baseline (float64, else float32 by the memory free, else skipped with the reason; and up to ease_max_items)
    ease_max_items: int = 50_000  # EASE needs an items x items inverse
    # λ grid tuned on valid; each value is one O(items³) factorisation (its time: docs/evaluation.md), so
    # large catalogs may want one or two values
    ease_lambdas: list[float] = field(default_factory=lambda: list(EASE_LAMBDAS))
    # EASE is skipped, saying so with the estimate, when its λ sweep would take longer than this (each
    # λ timed on a probe factorisation and scaled by I³); 0 = no limit
    ease_max_minutes: float = 60.0
    ials: bool = True  # iALS baseline (implicit's ALS, tuned on valid like EASE)
    # GF-CF's graph filter alone and fused with the two-tower (the run's eval.graph_filter grids, tuned on valid)
    graph_filter: bool = True
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
    store.store(name="config_schema", node=Config)
    store.store(name="evaluate_schema", node=EvaluateConfig)
    store.store(name="export_schema", node=ExportConfig)
    store.store(name="plan_schema", node=PlanConfig)
