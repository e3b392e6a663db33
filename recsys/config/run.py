"""The training config's root (``Config``): what its sections imply together (the query's features, the
protocol's defaults), ``check_values`` over every section, and reading a run's saved config."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import DictConfig

from data_pipelines.config import Protocol, to_typed
from data_pipelines.errors import ConfigError
from recsys.config.data import DataConfig, QueryHistory
from recsys.config.evaluation import EvalConfig, check_eval
from recsys.config.model import IdMapping, ModelConfig, check_model
from recsys.config.need import Need
from recsys.config.training import OptimConfig, ShardingConfig, TrainerConfig, check_optim, check_trainer
from recsys.config.tune import TuneConfig, check_tune

log = logging.getLogger(__name__)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)  # the dataset and its split: groups data, data/protocol
    model: ModelConfig = field(default_factory=ModelConfig)  # tables, features, towers, loss: group model
    optim: OptimConfig = field(default_factory=OptimConfig)  # the tables' and the towers' optimizers: optim/*
    sharding: ShardingConfig = field(default_factory=ShardingConfig)  # where tables go: group sharding
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # the training loop: group trainer
    eval: EvalConfig = field(default_factory=EvalConfig)  # validation and the evaluation stage: group eval
    tune: TuneConfig = field(default_factory=TuneConfig)  # the budgeted search on valid before training: group tune
    run_name: str = "default"  # names the run dir: runs/<run_name>


def query_uses_user_id(cfg: Config) -> bool:
    """Whether the query tower sees the user id: ``model.query_user_id``, or by the history choice when null.

    With a profile bag the user-id table overfits early (a row per user against a bag of the user's own items)
    where the bag alone keeps improving (measured: docs/quality.md)."""
    if cfg.model.query_user_id is not None:
        return cfg.model.query_user_id
    if cfg.model.query_encoder.user:  # the encoder blends the user id with the history (model/query_encoder=gated)
        return True
    return cfg.data.query_history != "profile" or cfg.data.history_length <= 0


def query_not_exportable(cfg: Config) -> str:
    """Why the serving bundle cannot serve this run's query encoder yet ("" when it can): recsys.export refuses such
    a run, and results.json says so of the two-tower and its fusions."""
    if cfg.model.id_mapping == IdMapping.managed and query_uses_neighbors(cfg):
        return (
            "model.id_mapping=managed with model.query_neighbors cannot be exported yet: the bundle's query encoder "
            "looks the history up in the item and neighbour tables by the same ids, and managed tables give an id "
            "another row in each"
        )
    return ""  # a sequence encoder beside managed ids is refused before training (recsys/config/model.py)


def uses_sequence_encoder(cfg: Config) -> bool:
    """Whether the query encoder reads its history per position (a ``sequence`` KJT key and table, e.g.
    sasrec's) instead of the item table's pooled bag: what the encoder's Config says."""
    return cfg.model.query_encoder.sequence


def query_uses_neighbors(cfg: Config) -> bool:
    """Whether the query pools its history bag through the neighbour table too: ``model.query_neighbors``, or
    whenever there is such a table and a pooled history bag when null."""
    if cfg.model.query_neighbors is not None:
        return cfg.model.query_neighbors
    return cfg.data.item_neighbors > 0 and cfg.data.history_length > 0 and not uses_sequence_encoder(cfg)


def query_layout(cfg: Config) -> dict[str, bool]:
    """What the query rows of a batch carry (keyword arguments of recsys.data.feature_builder's FeatureBuilder and
    TrainBatches): the user id, the history as a sequence, the history bag through the neighbour table."""
    return {
        "user_id": query_uses_user_id(cfg),
        "sequence": uses_sequence_encoder(cfg),
        "query_neighbors": query_uses_neighbors(cfg),
    }


def check_values(cfg: Config) -> None:
    """Refuse values no run can use, naming the key, before any work (types are Hydra's job); each section's
    rules sit beside its dataclass."""
    cfg = resolve_protocol(cfg)[0]  # the values a run would use
    problems = []

    def need(ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: {rule}")

    check_trainer(cfg.trainer, cfg.model, cfg.data, need)
    check_optim(cfg.optim, need)
    check_model(cfg.model, cfg.data, need)
    check_data(cfg, need)
    check_eval(cfg.eval, need)
    check_tune(cfg.tune, need, lambda path: has_path(cfg, path))
    if problems:
        raise ConfigError("bad config values: " + "; ".join(problems))


def check_data(cfg: Config, need: Need) -> None:
    """data.* as the model reads it (the split settings are data_pipelines' to check), and data.slices
    (docs/continuous-training.md)."""
    d, m = cfg.data, cfg.model
    need(d.history_length >= 0, "data.history_length", d.history_length, "must be >= 0 (0 disables history)")
    need(0.0 <= d.history_dropout < 1.0, "data.history_dropout", d.history_dropout, "must be in [0, 1)")
    need(d.item_neighbors >= 0, "data.item_neighbors", d.item_neighbors, "must be >= 0 (0 disables the feature)")
    need(
        d.item_neighbors == 0 or "neighbor" in m.tables,
        "data.item_neighbors",
        d.item_neighbors,
        "needs a table model.tables.neighbor (embedding_dim, pooling)",
    )
    if not d.slices:
        return
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
    need(
        not cfg.trainer.refit,
        "trainer.refit",
        cfg.trainer.refit,
        "data.slices trains each slice for trainer.epochs: no refit",
    )


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


def has_path(cfg: Any, path: str) -> bool:
    """Whether ``path`` (dotted) names a value of the config ``cfg`` (dataclass fields and dict keys)."""
    node = cfg
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        else:
            return False
    return not dataclasses.is_dataclass(node) and not isinstance(node, dict)


def with_values(cfg: Any, values: dict[str, Any]) -> Any:
    """``cfg`` (a dataclass tree) with each dotted path of ``values`` set, the rest shared (nothing is mutated)."""
    for path, value in values.items():
        cfg = _set(cfg, path.split("."), value)
    return cfg


def value_at(cfg: Any, path: str) -> Any:
    """The value at the dotted ``path`` of ``cfg`` (a dataclass tree, dicts inside)."""
    node = cfg
    for part in path.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def _set(node: Any, parts: list[str], value: Any) -> Any:
    head, rest = parts[0], parts[1:]
    inner = node[head] if isinstance(node, dict) else getattr(node, head)
    new = value if not rest else _set(inner, rest, value)
    if isinstance(node, dict):
        return {**node, head: new}
    return replace(node, **{head: new})
