"""The one place a ``RetrievalTask(TwoTower)`` is built from a model config.

Called by the run assembly (recsys/job/assemble.py, through :func:`build_task`), the planner dry run
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

from recsys.config import IdMapping, ModelConfig
from recsys.data.dataset import RetrievalData
from recsys.data.features import ALL_TABLES, SEQUENCE_TABLE
from recsys.data.layout import CANDIDATE, QUERY, USER, FeatureLayout, SideEntry, feature_layout
from recsys.model.managed import MANAGED_TABLES, ZCH_SIZE_OF
from recsys.model.task import RetrievalTask
from recsys.model.two_tower import TwoTower, table_configs


def build_retrieval_task(
    model: ModelConfig,
    *,
    num_rows: Mapping[str, int],
    item_counts: torch.Tensor,
    layout: FeatureLayout | None = None,
    history_length: int = 0,
    side_towers: Mapping[str, Sequence[str]] | None = None,
    seed: int | None = None,
    device: torch.device | None = None,
    extra_tables: Sequence[EmbeddingBagConfig] = (),
) -> RetrievalTask:
    """The model (``num_rows`` tables, towers ``model.tower_dims``) wrapped in its loss.

    ``layout``: the keys each tower reads, in order (recsys/data/layout.py; a run's: its plan's). None: a
    model without a dataset (the planner's dry run, the benches): ``default_layout(model, history_length,
    side_towers)``. ``item_counts``: [num_items] training frequencies for logQ. ``seed``: torch's seed before the
    towers are built (None: as it stands). ``device``: where the towers and buffers go (``meta`` for a dry run).
    ``extra_tables``: further query-side tables, one KJT key each (the bench's side features).
    With ``model.id_mapping=managed`` the user / item / neighbour tables get model.managed.zch_size rows whatever
    ``num_rows`` says (recsys/model/managed.py).
    """
    layout = layout or default_layout(model, history_length, side_towers or {})
    if seed is not None:
        torch.manual_seed(seed)
    managed_tables = [t for t in MANAGED_TABLES if t in num_rows] if model.id_mapping == IdMapping.managed else []
    num_rows = {**num_rows, **{t: model.managed.zch_size[ZCH_SIZE_OF[t]] for t in managed_tables}}
    configs = table_configs(
        num_rows=num_rows,
        dims={t: c.embedding_dim for t, c in model.tables.items()},
        poolings={t: c.pooling for t, c in model.tables.items()},
    ) + list(extra_tables)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        sequence_table, sequence_encoder = sequence_lookup(model, layout, int(num_rows["item"]))
        two_tower = TwoTower(
            configs,
            query_tables=layout.tower_keys(QUERY) + [c.name for c in extra_tables],
            candidate_tables=layout.tower_keys(CANDIDATE),
            tower_dims=model.tower_dims,
            sequence_table=sequence_table,
            sequence_encoder=sequence_encoder,
            managed_tables=managed_tables,
            managed_options={
                "eviction_policy_name": str(model.managed.eviction_policy),
                "eviction_interval": model.managed.eviction_interval,
                "decay_exponent": model.managed.decay_exponent,
            },
            blend_key=USER if sequence_encoder is not None and model.query_encoder.user else None,
            item_bias=model.uses_item_bias,
        )
        return RetrievalTask(
            two_tower,
            item_counts=item_counts,
            loss=model.loss.build(),
            num_negatives=model.negatives.num,
            negative_exponent=model.negatives.exponent,
        )


def default_layout(model: ModelConfig, history_length: int, side_towers: Mapping[str, Sequence[str]]) -> FeatureLayout:
    """The layout of a model built without a dataset: the user id, the history with its categories (through the
    sequence key when the query encoder reads it per position, e.g. sasrec), no neighbours; ``side_towers``: side
    tables -> the towers they feed (each a feature named after its table; a query one reads a users column, which
    the model cannot tell from an items one)."""
    side = [
        SideEntry(table, table, tower, "users" if tower == QUERY else "items")
        for table, towers in side_towers.items()
        for tower in towers
    ]
    return feature_layout(history_length=history_length, sequence=model.query_encoder.sequence, side=side)


def sequence_lookup(
    model: ModelConfig, layout: FeatureLayout, num_items: int
) -> tuple[EmbeddingConfig | None, torch.nn.Module | None]:
    """The sequence key's table (item-sized, ``model.query_encoder.dim`` columns, looked up per position) and the
    query encoder's module that reads it (``model.query_encoder.build``: recsys/model/query_encoders), or
    (None, None) when the layout has no sequence key."""
    if not layout.sequence:
        return None, None
    encoder = model.query_encoder
    table = EmbeddingConfig(
        name=SEQUENCE_TABLE, num_embeddings=num_items, embedding_dim=encoder.dim, feature_names=[SEQUENCE_TABLE]
    )
    user_dim = model.tables[USER].embedding_dim if encoder.user else 0  # the width of what a blend reads
    return table, encoder.build(layout.history_length, user_dim)


def build_task(
    model: ModelConfig,
    data: RetrievalData,
    layout: FeatureLayout,
    *,
    seed: int | None = None,
    item_counts: np.ndarray | None = None,
) -> RetrievalTask:
    """A run's model for ``data``: its tables checked against ``model``, its keys and towers those of ``layout`` (the
    run plan's: recsys/job/plan.py), the towers seeded by ``seed``.

    ``item_counts``: the items' training frequencies for logQ; None = ``data.example_item_counts()``.
    """
    tables = model.tables
    if set(model.features) != {f.name for f in data.side_features}:
        raise ValueError(
            f"model.features {sorted(model.features)}: the data carries {sorted(f.name for f in data.side_features)}"
            " (load it through recsys.data.side_features.with_side_features)"
        )
    num_rows = {t: n for t, n in data.table_num_rows.items() if t in layout.keys()}
    for name in num_rows:  # no category table for data without categories: none is faked
        if name not in tables:
            raise ValueError(f"model.tables.{name}: missing (tables given: {sorted(tables)})")
    unknown = set(tables) - set(ALL_TABLES) - {s.table for s in layout.side_specs()}
    if unknown:
        raise ValueError(
            f"model.tables: unknown tables {sorted(unknown)}; expected {', '.join(ALL_TABLES)} "
            "or a table named by model.features"
        )
    counts = data.example_item_counts() if item_counts is None else item_counts
    return build_retrieval_task(
        model, layout=layout, num_rows=num_rows, item_counts=torch.from_numpy(counts), seed=seed
    )
