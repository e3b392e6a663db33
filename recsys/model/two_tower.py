"""Two-tower retrieval model: one EmbeddingBagCollection feeding a query and a candidate tower.

The model knows nothing about processes or devices beyond where it is built: the embedding
tables are built on the meta device and materialised by ``recsys.distributed.shard_model``;
the towers are ordinary modules (so they are initialised from the torch seed, identically on
every rank).

Shapes (B_q queries, S candidate rows, F features, D tower output)::

    features: KJT, stride S; query features filled in rows [0, B_q), empty below
    ebc(features) -> KeyedTensor  S x sum(table dims)
    query tower:     B_q x (dims of query features)     -> B_q x D, L2-normalised
    candidate tower: S   x (dims of candidate features) -> S   x D, L2-normalised
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from recsys.data.features import CANDIDATE_FEATURES, FEATURE_TABLES


def mlp(in_dim: int, dims: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them and none after the last (the output is normalised)."""
    layers: List[nn.Module] = []
    for i, out_dim in enumerate(dims):
        layers.append(nn.Linear(in_dim, out_dim))
        if i < len(dims) - 1:
            layers.append(nn.ReLU())
        in_dim = out_dim
    return nn.Sequential(*layers)


def table_configs(
    *, num_rows: dict, dims: dict, poolings: dict, query_features: Sequence[str]
) -> List[EmbeddingBagConfig]:
    """One EmbeddingBagConfig per table, listing every feature that looks it up."""
    features = list(query_features) + CANDIDATE_FEATURES
    configs = []
    for table in ("user", "item", "category"):
        names = [f for f in features if FEATURE_TABLES[f] == table]
        configs.append(
            EmbeddingBagConfig(
                name=table,
                num_embeddings=int(num_rows[table]),
                embedding_dim=int(dims[table]),
                feature_names=names,
                pooling=PoolingType[poolings[table].upper()],
            )
        )
    return configs


class TwoTower(nn.Module):
    def __init__(
        self,
        tables: List[EmbeddingBagConfig],
        *,
        query_features: Sequence[str],
        tower_dims: Sequence[int],
    ) -> None:
        super().__init__()
        self.query_features = list(query_features)
        self.candidate_features = list(CANDIDATE_FEATURES)
        dim_of_feature = {f: t.embedding_dim for t in tables for f in t.feature_names}
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.query_tower = mlp(sum(dim_of_feature[f] for f in self.query_features), tower_dims)
        self.candidate_tower = mlp(sum(dim_of_feature[f] for f in self.candidate_features), tower_dims)

    def forward(self, features: KeyedJaggedTensor, num_queries: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Returns (queries ``B_q x D``, candidates ``S x D``), both with unit L2 norm."""
        # one fused permute (fbgemm's permute_pooled_embs) forward and backward, instead of a
        # split per feature, a slice per query feature and a cat per tower
        query_in, candidate_in = KeyedTensor.regroup(
            [self.ebc(features)], [self.query_features, self.candidate_features]
        )
        query_in = query_in[:num_queries]
        queries = F.normalize(self.query_tower(query_in), dim=-1)
        candidates = F.normalize(self.candidate_tower(candidate_in), dim=-1)
        return queries, candidates
