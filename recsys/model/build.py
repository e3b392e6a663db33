"""The one place a ``RetrievalTask(TwoTower)`` is built from a model config.

Called by the run assembly (recsys/run.py, through :func:`build_task`), the planner dry run
(recsys/distributed/dry_run.py, on the meta device) and scripts/bench_train.py. Embedding tables
are on the meta device either way (``recsys.distributed.shard_model`` materialises them); the
towers are initialised from ``seed``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

from recsys.config import (
    Config,
    IdMapping,
    ModelConfig,
    QueryEncoderKind,
    query_uses_neighbors,
    query_uses_user_id,
)
from recsys.data.dataset import RetrievalData
from recsys.data.features import ALL_TABLES, NEIGHBOR_TABLE, SEQUENCE_TABLE, candidate_tables, query_tables
from recsys.model.managed import MANAGED_TABLES, ZCH_SIZE_OF
from recsys.model.sequence import SequenceEncoder
from recsys.model.task import RetrievalTask
from recsys.model.two_tower import TwoTower, table_configs


def build_retrieval_task(
    model: ModelConfig,
    *,
    num_rows: Mapping[str, int],
    history_length: int,
    item_counts: torch.Tensor,
    has_categories: bool = True,
    has_neighbors: bool = False,
    query_neighbors: bool = False,
    user_id: bool = True,
    seed: int | None = None,
    device: torch.device | None = None,
    extra_tables: Sequence[EmbeddingBagConfig] = (),
    side_towers: Mapping[str, Sequence[str]] | None = None,
) -> RetrievalTask:
    """The model (``num_rows`` tables, towers ``model.tower_dims``) wrapped in its loss.

    ``query_neighbors``: the query tower also reads the history bag pooled through the neighbour table
    (model.query_neighbors), after the built-in query tables. ``item_counts``: [num_items] training
    frequencies for logQ. ``seed``: torch's seed before the towers are built (None: as it stands).
    ``device``: where the towers and buffers go (``meta`` for a dry run). ``extra_tables``: further
    query-side tables, one KJT key each (the bench's side features).
    ``side_towers``: the side tables of ``num_rows`` (model.features) -> the towers they feed ("query",
    "candidate"), each tower reading them after its built-in tables in this order.
    With ``model.id_mapping=managed`` the user / item / neighbour tables get model.managed.zch_size rows whatever
    ``num_rows`` says (recsys/model/managed.py).
    """
    if seed is not None:
        torch.manual_seed(seed)
    tables = model.tables
    managed_tables: list[str] = []
    if model.id_mapping == IdMapping.managed:
        managed_tables = [t for t in MANAGED_TABLES if t in num_rows]
        num_rows = {**num_rows, **{t: model.managed.zch_size[ZCH_SIZE_OF[t]] for t in managed_tables}}
    configs = table_configs(
        num_rows=num_rows,
        dims={t: c.embedding_dim for t, c in tables.items()},
        poolings={t: c.pooling for t, c in tables.items()},
    ) + list(extra_tables)
    side = dict(side_towers or {})
    side_query = [t for t, towers in side.items() if "query" in towers]
    side_candidate = [t for t, towers in side.items() if "candidate" in towers]
    sequence = model.query_encoder == QueryEncoderKind.sasrec
    with torch.device(device) if device is not None else contextlib.nullcontext():
        sequence_table = sequence_encoder = None
        if sequence:  # an item-sized table of its own, looked up per position (recsys.model.sequence)
            sq = model.sasrec
            sequence_table = EmbeddingConfig(
                name=SEQUENCE_TABLE,
                num_embeddings=int(num_rows["item"]),
                embedding_dim=sq.dim,
                feature_names=[SEQUENCE_TABLE],
            )
            sequence_encoder = SequenceEncoder(
                sq.dim, history_length, num_layers=sq.num_layers, num_heads=sq.num_heads, dropout=sq.dropout
            )
        two_tower = TwoTower(
            configs,
            query_tables=query_tables(history_length, has_categories, user_id, sequence)
            + ([NEIGHBOR_TABLE] if query_neighbors else [])
            + side_query
            + [c.name for c in extra_tables],
            candidate_tables=candidate_tables(has_categories, has_neighbors) + side_candidate,
            tower_dims=model.tower_dims,
            sequence_table=sequence_table,
            sequence_encoder=sequence_encoder,
            managed_tables=managed_tables,
            managed_options={
                "eviction_policy_name": str(model.managed.eviction_policy),
                "eviction_interval": model.managed.eviction_interval,
                "decay_exponent": model.managed.decay_exponent,
            },
        )
        return RetrievalTask(
            two_tower,
            item_counts=item_counts,
            temperature=model.temperature,
            logq_correction=model.logq_correction,
            logq_weight=model.logq_weight,
            num_uniform_negatives=model.num_uniform_negatives,
            loss=str(model.loss),
            margin=model.margin,
            negative_weight=model.negative_weight,
        )


def build_task(cfg: Config, data: RetrievalData, item_counts: np.ndarray | None = None) -> RetrievalTask:
    """A run's model for ``data``: its tables checked against the config, towers seeded by ``trainer.seed``.

    ``item_counts``: the items' training frequencies for logQ; None = ``data.example_item_counts()``.
    """
    tables = cfg.model.tables
    user_id = query_uses_user_id(cfg)
    query_neighbors = query_uses_neighbors(cfg)
    num_rows = {t: n for t, n in data.table_num_rows.items() if user_id or t != "user"}
    for name in num_rows:  # no category table for data without categories: none is faked
        if name not in tables:
            raise ValueError(f"model.tables.{name}: missing (tables given: {sorted(tables)})")
    side_towers: dict[str, list[str]] = {}
    for feature in data.side_features:  # model.features, read by recsys.data.side_features.with_side_features
        side_towers.setdefault(feature.table, []).append(feature.tower)
    if set(cfg.model.features) != {f.name for f in data.side_features}:
        raise ValueError(
            f"model.features {sorted(cfg.model.features)}: the data carries {sorted(f.name for f in data.side_features)}"
            " (load it through recsys.data.side_features.with_side_features)"
        )
    if data.has_neighbors != (cfg.data.item_neighbors > 0):
        raise ValueError(
            f"data.item_neighbors={cfg.data.item_neighbors} but the dataset was loaded "
            f"{'with' if data.has_neighbors else 'without'} item neighbours: open it with "
            "recsys.run.open_dataset(cfg, root)"
        )
    unknown = set(tables) - set(ALL_TABLES) - set(side_towers)
    if unknown:
        raise ValueError(
            f"model.tables: unknown tables {sorted(unknown)}; expected {', '.join(ALL_TABLES)} "
            "or a table named by model.features"
        )
    counts = data.example_item_counts() if item_counts is None else item_counts
    return build_retrieval_task(
        cfg.model,
        num_rows=num_rows,
        history_length=cfg.data.history_length,
        item_counts=torch.from_numpy(counts),
        has_categories=data.has_categories,
        has_neighbors=data.has_neighbors,
        query_neighbors=query_neighbors,
        user_id=user_id,
        seed=cfg.trainer.seed,
        side_towers=side_towers,
    )
