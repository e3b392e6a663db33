"""model.id_mapping=managed: the tables looked up by raw user / item ids, through torchrec's managed collisions.

    raw ids (KJT keys "user", "item", "neighbor")
      -> ManagedCollisionEmbeddingBagCollection
           MCHManagedCollisionModule per table: hash_keys (recsys/data/raw_ids.py), then the key's row in
           [0, zch_size) (a sorted key -> row map; an id it does not hold gets the table's last row)
           EmbeddingBagCollection of zch_size-row tables
      -> pooled KeyedTensor, beside the plain EmbeddingBagCollection's (category, side tables)

In training each step first admits the step's new ids (``eviction_interval=1``: before they are looked up),
replacing the eviction policy's least valuable ids when a table is full; the sharded module
(recsys/distributed/managed.py) re-initialises the admitted rows from their ids. Nothing here imports
torch.distributed: the modules are built on the meta device and sharded row-wise by ``shard_model``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHEvictionPolicy,
    MCHManagedCollisionModule,
)
from torchrec.sparse.jagged_tensor import JaggedTensor

from recsys.data.features import NEIGHBOR_TABLE
from recsys.data.raw_ids import KEY_SPACE, hash_keys

# tables a managed model looks up by raw ids; the neighbour table is keyed by item ids and sized like the item table
MANAGED_TABLES = ("user", "item", NEIGHBOR_TABLE)
ZCH_SIZE_OF = {"user": "user", "item": "item", NEIGHBOR_TABLE: "item"}  # the model.managed.zch_size entry of each


def eviction_policy(name: str, decay_exponent: float) -> MCHEvictionPolicy:
    """model.managed.eviction_policy -> torchrec's policy object."""
    if name == "lru":
        return LRU_EvictionPolicy(decay_exponent=decay_exponent)
    if name == "lfu":
        return LFU_EvictionPolicy()
    if name == "distance_lfu":
        return DistanceLFU_EvictionPolicy(decay_exponent=decay_exponent)
    raise ValueError(f"model.managed.eviction_policy={name!r}: expected lru, lfu or distance_lfu")


class GrowingMCH(MCHManagedCollisionModule):
    """torchrec's MCH module whose id history buffer grows to the step's ids.

    torchrec sizes the buffer from the first batch (x 1.25) and drops what a larger later batch does not fit: those
    ids would never be admitted that step. Query histories make the item key's size vary from batch to batch.
    """

    def profile(self, features: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
        if self.training and self._input_history_buffer_size != -1:
            need = self._current_history_buffer_offset + sum(int(f.values().numel()) for f in features.values())
            if need > self._input_history_buffer_size:
                self._grow(2 * need)
        return super().profile(features)

    @torch.no_grad()
    def _grow(self, size: int) -> None:
        used = self._current_history_buffer_offset
        accumulator = torch.empty(size, dtype=torch.int64, device=self._history_accumulator.device)
        accumulator[:used] = self._history_accumulator[:used]
        self._history_accumulator = accumulator
        for name, old in list(self._history_metadata.items()):
            new = torch.zeros(size, dtype=torch.int64, device=old.device)
            new[:used] = old[:used]
            setattr(self, "_history_" + name, new)  # a registered (non-persistent) buffer: replaced in place
            self._history_metadata[name] = new
        self._input_history_buffer_size = size


def managed_collection(
    configs: Sequence[EmbeddingBagConfig],
    *,
    eviction_policy_name: str,
    eviction_interval: int,
    decay_exponent: float,
) -> ManagedCollisionEmbeddingBagCollection:
    """The managed tables ``configs`` (num_embeddings = zch_size) with one MCH module each, on the meta device."""
    meta = torch.device("meta")
    modules = {
        c.name: GrowingMCH(
            zch_size=c.num_embeddings,
            device=meta,
            eviction_policy=eviction_policy(eviction_policy_name, decay_exponent),
            eviction_interval=eviction_interval,
            input_hash_size=KEY_SPACE,
            input_hash_func=hash_keys,
            name=c.name,
        )
        for c in configs
    }
    return ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=list(configs), device=meta),
        ManagedCollisionCollection(modules, list(configs)),
    )
