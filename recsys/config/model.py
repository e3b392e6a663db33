"""The ``model`` section of the training config (conf/model/*.yaml): tables, side features, towers, the loss,
the query's encoder and the ids' mapping; ``check_model`` refuses values no run can use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from data_pipelines.config import Choice
from recsys.components.losses import PACKAGE as LOSSES
from recsys.components.query_encoders import PACKAGE as QUERY_ENCODERS
from recsys.components.registry import to_component
from recsys.config.data import DataConfig
from recsys.config.need import Need

POOLINGS = ("sum", "mean")  # model.tables.<name>.pooling
FEATURE_SOURCES = ("users", "items")  # model.features.<name>.source
TOWERS = ("query", "candidate")  # model.features.<name>.tower


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
class NegativesConfig:
    """Candidates drawn for the whole global batch beside its positives, shared by every query (each query is scored
    against B + num candidates: one [B, B + num] product, in row blocks as the loss's block_mb says). The loss's logQ
    takes their probability into account: q(i) = (B p(i) + num s(i)) / (B + num), s the distribution drawn from."""

    # items drawn per global batch (with replacement, the same on every rank); 0 = the in-batch positives alone;
    # -1 = the whole catalogue every step, no sampling: a full softmax (each query against every item once, no logQ)
    num: int = 0
    # drawn with probability proportional to (training count)^exponent: 0 = uniform, 1 = the items' training
    # frequency (as the in-batch positives are), 0.75 = word2vec's; items never trained on get none when > 0
    exponent: float = 0.0


@dataclass
class ModelConfig:
    tables: dict[str, TableConfig] = field(default_factory=dict)  # user / item / category tables + side tables
    # side features by name, beside the built-in user / item / category ones; {} = none (today's model)
    features: dict[str, FeatureConfig] = field(default_factory=dict)
    tower_dims: list[int] = field(default_factory=lambda: [256])  # MLP widths of each tower; last = output dim
    # true: the candidate tower's last output is the item's logit bias (unnormalised, scaled by 1 / temperature as the
    # rest of the score), the query's a constant 1, so the served score <q, c> + b_i is still one dot product of the
    # last tower width; the other widths' L2-normalised (docs/quality.md, "The item bias"); false: both unit vectors;
    # null: true with the softmax loss, false with ccl (whose margins are on cosines). A run saved before the field
    # existed reads false (recsys/rundir/saved_config.py)
    item_bias: bool | None = None
    # items sampled for the whole global batch beside its positives (model.negatives.num; -1: the whole catalogue)
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    # the training loss, a component chosen by name (model/loss=NAME: conf/model/loss/NAME.yaml, whose settings the
    # sections below list; its code recsys/components/losses/NAME.py)
    loss: Any = field(default_factory=lambda: {"name": "softmax"})
    # the query tower sees the user-id embedding (true) or its history bag alone (false: no user table
    # is built); null = by data.query_history: false with "profile", true with "recent" (docs/quality.md); true with
    # a query encoder that blends the user id in (model/query_encoder=gated)
    query_user_id: bool | None = None
    # the query also pools its history bag through the neighbour table (the table of the candidates'
    # co-occurrence neighbours), so a history item meets a candidate's neighbours in one space: an
    # item-kNN-like term at the cost of one more bag lookup per query (the default's measure: docs/quality.md).
    # null = whenever that table exists (data.item_neighbors > 0) and the query pools a history bag
    query_neighbors: bool | None = None
    # how the query reads its history, a component chosen by name (model/query_encoder=NAME:
    # conf/model/query_encoder/NAME.yaml, whose settings the sections below list; its code
    # recsys/components/query_encoders/NAME.py): bag (the mean-pooled item bag) | sasrec (the recent items in order) |
    # attention (the items weighed by learned attention) | gated (the user id and the pooled history, gated)
    query_encoder: Any = field(default_factory=lambda: {"name": "bag"})
    # vocab: the user / item tables have a row per dataset index; managed: raw 64-bit ids, model.managed
    id_mapping: IdMapping = IdMapping.vocab
    managed: ManagedConfig = field(default_factory=ManagedConfig)  # model.id_mapping=managed only

    def __post_init__(self) -> None:
        self.loss = to_component(self.loss, LOSSES, "model.loss")
        self.query_encoder = to_component(self.query_encoder, QUERY_ENCODERS, "model.query_encoder")

    @property
    def uses_item_bias(self) -> bool:
        """model.item_bias resolved: null is true with the softmax loss (a loss over logits), false otherwise."""
        return self.item_bias if self.item_bias is not None else self.loss.name == "softmax"


# ModelConfig's fields that hold a component's section (recsys/components/registry.py)
COMPONENT_SECTIONS = ("loss", "query_encoder")


def open_components(model_node: DictConfig) -> None:
    """A structured ``model`` node's component sections as plain dicts of their name: Hydra's struct mode would
    merge only the default component's keys into the typed section; to_component refuses unknown keys instead."""
    for key in COMPONENT_SECTIONS:
        model_node[key] = {"name": model_node[key].name}
        OmegaConf.set_struct(model_node[key], False)


def check_model(m: ModelConfig, d: DataConfig, need: Need) -> None:
    """model.* (with the data settings it reads): the loss, towers, tables, side features, the query's
    neighbours and encoder, the managed ids."""
    neg = m.negatives
    need(neg.num >= -1, "model.negatives.num", neg.num, "must be >= 0, or -1 (the whole catalogue)")
    need(0 <= neg.exponent <= 2, "model.negatives.exponent", neg.exponent, "must be in [0, 2] (0 uniform, 1 frequency)")
    m.loss.check(need, "model.loss")
    need(
        all(w >= 1 for w in m.tower_dims) and len(m.tower_dims) > 0,
        "model.tower_dims",
        m.tower_dims,
        "must be widths >= 1",
    )
    if m.uses_item_bias:
        need(m.tower_dims[-1] >= 2, "model.tower_dims", m.tower_dims, "model.item_bias needs a last width >= 2")
        need(m.loss.name == "softmax", "model.item_bias", m.item_bias, f"needs model/loss=softmax (got {m.loss.name})")
    for name, table in m.tables.items():
        need(table.embedding_dim >= 1, f"model.tables.{name}.embedding_dim", table.embedding_dim, "must be >= 1")
        need(table.pooling in POOLINGS, f"model.tables.{name}.pooling", table.pooling, "must be 'sum' or 'mean'")
    for name, feature in m.features.items():
        _check_feature(name, feature, m, d, need)
    if m.query_neighbors:
        need(
            d.item_neighbors > 0 and d.history_length > 0 and not m.query_encoder.sequence,
            "model.query_neighbors",
            m.query_neighbors,
            "pools the query's history bag through the neighbour table: needs data.item_neighbors > 0, "
            f"data.history_length > 0 and a pooled history bag, model/query_encoder=bag (got {d.item_neighbors}, "
            f"{d.history_length}, {m.query_encoder.name}); null turns it on where it applies",
        )
    m.query_encoder.check(need, "model.query_encoder", d)
    need(
        not (m.query_encoder.user and m.query_user_id is False),
        "model.query_user_id",
        m.query_user_id,
        f"model/query_encoder={m.query_encoder.name} blends the user id with the history: use null (true then) or true",
    )
    if m.id_mapping == IdMapping.managed:
        _check_managed(m, d, need)


def _check_feature(name: str, feature: FeatureConfig, m: ModelConfig, d: DataConfig, need: Need) -> None:
    key, tables = f"model.features.{name}", m.tables
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
        table in tables,
        f"{key}.table",
        table,
        f"no such table in model.tables ({', '.join(sorted(tables))}); add model.tables.{table}",
    )


def _check_managed(m: ModelConfig, d: DataConfig, need: Need) -> None:
    """model.id_mapping=managed (docs/continuous-training.md): values no run can use."""
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
        not m.query_encoder.sequence,
        "model.query_encoder.name",
        m.query_encoder.name,
        "model.id_mapping=managed has no managed sequence table yet: use model/query_encoder=bag",
    )
