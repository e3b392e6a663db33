"""Two-tower retrieval model: one EmbeddingBagCollection feeding a query and a candidate tower.

The model knows nothing about processes or devices beyond where it is built: the embedding
tables are built on the meta device and materialised by ``recsys.distributed.shard_model``;
the towers are ordinary modules (so they are initialised from the torch seed, identically on
every rank).

Shapes (B_q queries, C candidates, D tower output)::

    features: KJT, one key per table, stride B_q + C (layout: recsys.data.features)
    ebc(features) -> KeyedTensor  (B_q + C) x sum(table dims)
    query tower:     rows [0, B_q) of the query tables' columns        -> B_q x D, L2-normalised
    candidate tower: rows [B_q, B_q + C) of the candidate tables' ones -> C x D, L2-normalised

With ``item_bias`` (model.item_bias) the candidate's last column is its bias b (unnormalised) and the query's a
constant 1, the other D - 1 columns of each unit vectors: <query, candidate> = <q, c> + b, one dot product of D.

With managed ids (``model.id_mapping=managed``, recsys/model/managed.py) the user / item / neighbour keys carry
raw ids and go through ``mc_ebc`` (a ManagedCollisionEmbeddingBagCollection), the other keys through ``ebc``;
both read the one KJT (each takes its own keys) and their pooled columns are regrouped together.

With a query encoder that reads the history per position (``model/query_encoder=sasrec``, recsys/model/query_encoders)
an EmbeddingCollection looks the ``sequence`` key up unpooled, and the query tower reads the encoder's output before
the pooled query columns::

    ec(features)["sequence"] -> JaggedTensor (sum of history lengths) x D_s -> B_q x L x D_s
    sequence_encoder -> B_q x D_s ; query tower input: [B_q x D_s | pooled query columns]

An encoder that blends the user id in (``blend_key``: model/query_encoder=gated) reads that key's pooled query
columns (B_q x D_u) too and returns B_q x D_u in their place: [B_q x D_u | the other pooled query columns].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor

from recsys.components.query_encoders.sequence import padded_history
from recsys.data.features import ALL_TABLES, CANDIDATE_TABLES
from recsys.model.managed import managed_collection


def mlp(in_dim: int, dims: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them and none after the last (the output is normalised)."""
    layers: list[nn.Module] = []
    for i, out_dim in enumerate(dims):
        layers.append(nn.Linear(in_dim, out_dim))
        if i < len(dims) - 1:
            layers.append(nn.ReLU())
        in_dim = out_dim
    return nn.Sequential(*layers)


def table_configs(*, num_rows: dict, dims: dict, poolings: dict) -> list[EmbeddingBagConfig]:
    """One EmbeddingBagConfig per table of ``num_rows`` (the built-in ones in ``ALL_TABLES`` order, then side
    tables in the order given), looked up by the one KJT key of the same name."""
    order = [t for t in ALL_TABLES if t in num_rows] + [t for t in num_rows if t not in ALL_TABLES]
    return [
        EmbeddingBagConfig(
            name=table,
            num_embeddings=int(num_rows[table]),
            embedding_dim=int(dims[table]),
            feature_names=[table],
            pooling=PoolingType[poolings[table].upper()],
        )
        for table in order
    ]


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward(): padding and encoding branch on sizes
def encode_history(
    encoder: nn.Module, history: JaggedTensor, num_queries: int, user: torch.Tensor | None = None
) -> torch.Tensor:
    """The first ``num_queries`` rows of an unpooled history lookup -> ``num_queries x D_s`` through ``encoder`` (a
    query encoder's module: recsys/model/query_encoders); with ``user`` (``num_queries x D_u``, the columns it blends
    in) -> ``num_queries x D_u``."""
    items, lengths = padded_history(history, num_queries, encoder.max_length)
    return encoder(items, lengths) if user is None else encoder(items, lengths, user)


def _column_runs(pooled: list[KeyedTensor], keys: Sequence[str]) -> list[tuple[int, int, int]]:
    """``keys``' pooled columns as (index into ``pooled``, first column, end column) runs, adjacent ones merged."""
    where = {}
    for i, kt in enumerate(pooled):
        for key, start, end in zip(kt.keys(), kt.offset_per_key()[:-1], kt.offset_per_key()[1:]):
            where[key] = (i, start, end)
    runs: list[tuple[int, int, int]] = []
    for key in keys:
        i, start, end = where[key]
        if runs and runs[-1][0] == i and runs[-1][2] == start:
            runs[-1] = (i, runs[-1][1], end)
        else:
            runs.append((i, start, end))
    return runs


@torch.fx.wrap  # a leaf when TrainPipelineSparseDist traces forward(): it reads the pooled keys' column offsets
def tower_inputs(
    pooled: list[KeyedTensor], query_keys: Sequence[str], candidate_keys: Sequence[str], num_queries: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [0, num_queries) of ``query_keys``' pooled columns, the other rows of ``candidate_keys``' columns).

    Each KeyedTensor is split by rows first (its backward: one contiguous cat), then each tower takes a column
    view where its keys are adjacent in the lookup's order (the usual case: no copy). torchrec's
    KeyedTensor.regroup builds both towers' columns for every row with a strided cat, a large share of a CPU step
    (measured: docs/performance.md, "What changed for speed")."""
    rows = [kt.values().split([num_queries, kt.values().size(0) - num_queries]) for kt in pooled]

    def columns(side: int, keys: Sequence[str]) -> torch.Tensor:
        parts = []
        for i, start, end in _column_runs(pooled, keys):
            block = rows[i][side]
            parts.append(block if (start, end) == (0, block.size(1)) else block[:, start:end])
        if not parts:  # the sequence encoder alone: no pooled query columns
            return rows[0][side][:, :0]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    return columns(0, query_keys), columns(1, candidate_keys)


class TwoTower(nn.Module):
    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        *,
        query_tables: Sequence[str],
        tower_dims: Sequence[int],
        candidate_tables: Sequence[str] = tuple(CANDIDATE_TABLES),
        sequence_table: EmbeddingConfig | None = None,
        sequence_encoder: nn.Module | None = None,
        managed_tables: Sequence[str] = (),
        managed_options: dict | None = None,
        blend_key: str | None = None,
        item_bias: bool = False,
    ) -> None:
        """``sequence_table`` and ``sequence_encoder`` (together or neither): the unpooled history lookup and the
        module that summarises it for the query tower (a query encoder's: recsys/model/query_encoders). ``managed_tables``: the tables
        looked up by raw ids through managed collisions (``managed_options``: recsys.model.managed.managed_collection's
        keyword arguments); their num_embeddings is their zch_size. ``blend_key``: a query key whose pooled columns
        the sequence encoder reads and replaces (the user id, for an encoder that blends it in)."""
        super().__init__()
        if (sequence_table is None) != (sequence_encoder is None):
            raise ValueError("TwoTower: sequence_table and sequence_encoder go together")
        if any(len(t.feature_names) != 1 for t in tables):
            raise ValueError("TwoTower: every table is looked up by exactly one KJT key (see recsys.data.features)")
        # the towers read tables' pooled columns by the key each table is looked up with
        key_of = {t.name: t.feature_names[0] for t in tables}
        self.query_keys = [key_of[t] for t in query_tables]
        self.candidate_keys = [key_of[t] for t in candidate_tables]
        dim = {t.feature_names[0]: t.embedding_dim for t in tables}
        managed = [t for t in tables if t.name in managed_tables]
        plain = [t for t in tables if t.name not in managed_tables]
        # no plain tables (a managed model without categories or side features): no plain collection
        self.ebc = EmbeddingBagCollection(tables=plain, device=torch.device("meta")) if plain else None
        self.mc_ebc = managed_collection(managed, **(managed_options or {})) if managed else None
        self.ec: EmbeddingCollection | None = None
        self.sequence_encoder = sequence_encoder
        sequence_dim = 0
        if sequence_table is not None:
            if sequence_table.feature_names != [sequence_table.name]:
                raise ValueError("TwoTower: the sequence table is looked up by the KJT key of its name")
            self.sequence_key, sequence_dim = sequence_table.name, sequence_table.embedding_dim
            self.ec = EmbeddingCollection(tables=[sequence_table], device=torch.device("meta"))
        self.blend_key = blend_key
        if blend_key is not None:
            if sequence_encoder is None or blend_key not in self.query_keys:
                raise ValueError(f"TwoTower: blend_key={blend_key!r} needs a sequence encoder and that query key")
            self.query_keys.remove(blend_key)  # the encoder's output takes its place
            sequence_dim = dim[blend_key]
        self.item_bias = item_bias
        query_dims = [*tower_dims[:-1], tower_dims[-1] - 1] if item_bias else tower_dims  # + the constant 1
        self.query_tower = mlp(sequence_dim + sum(dim[k] for k in self.query_keys), query_dims)
        self.candidate_tower = mlp(sum(dim[k] for k in self.candidate_keys), tower_dims)

    def forward(self, features: KeyedJaggedTensor, num_queries: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (queries ``B_q x D``, candidates ``C x D``), both with unit L2 norm (with ``item_bias``: their first
        D - 1 columns, then 1 and the candidate's bias)."""
        pooled = [self.ebc(features)] if self.ebc is not None else []
        if self.mc_ebc is not None:
            pooled.append(self.mc_ebc(features)[0])  # (pooled, remapped ids: not asked for)
        query_in, candidate_in = tower_inputs(pooled, self.query_keys, self.candidate_keys, num_queries)
        if self.ec is not None:
            history = self.ec(features)[self.sequence_key]
            user = None
            if self.blend_key is not None:
                user = tower_inputs(pooled, [self.blend_key], [], num_queries)[0]
            encoded = encode_history(self.sequence_encoder, history, num_queries, user)
            query_in = torch.cat([encoded, query_in], dim=1)
        # .float(): under autocast (trainer.precision=bf16) the towers' GEMMs are bf16, the norms are not
        queries = F.normalize(self.query_tower(query_in).float(), dim=-1)
        candidates = self.candidate_tower(candidate_in).float()
        if not self.item_bias:
            return queries, F.normalize(candidates, dim=-1)
        candidates = torch.cat([F.normalize(candidates[:, :-1], dim=-1), candidates[:, -1:]], dim=1)
        return with_bias_column(queries), candidates


def with_bias_column(queries: torch.Tensor) -> torch.Tensor:
    """``queries`` [B, D - 1] with the constant column [B, 1] that meets the candidates' bias (model.item_bias)."""
    return torch.cat([queries, queries.new_ones(queries.shape[0], 1)], dim=1)
