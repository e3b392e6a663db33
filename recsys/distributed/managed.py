"""Sharding the managed-collision tables (model.id_mapping=managed) on every device, CPU included.

torchrec shards a ManagedCollisionEmbeddingBagCollection row-wise only: each rank holds the rows
``[offset_r, offset_r + zch_size / world_size)`` of every managed table and the MCH state (key -> row map, eviction
metadata) of the keys in its range of the key space (keys are bucketed by value: ``hash_keys`` spreads them). What
recsys changes, measured on CPU with torchrec 1.8 / fbgemm-gpu-cpu 1.8 (docs/continuous-training.md):

- torchrec's sharder offers ROW_WISE only where the plain EBC sharder does, i.e. CUDA: on CPU the planner finds no
  option. :class:`ManagedSharder` offers row_wise on every device (the row-wise kernels run on CPU; measured).
- At each admission torchrec resets the admitted rows with fbgemm's ``reset_weight_momentum``, a CUDA-only op
  ("Could not run 'fbgemm::reset_weight_momentum' with arguments from the 'CPU' backend"). The sharded module here
  re-initialises them itself, on every device: rows drawn from the id's key (``admitted_rows``, so an id's first
  vector is the same whatever row or rank it lands on), optimizer state zeroed.
- The planner needs as many MCH buckets as ranks (``set_buckets``).
- Ids a table does not hold share the last row of their rank's range, which torchrec trains like any row (and which
  another rank's row replaces after resharding): it is kept at 0 before every lookup (``zero_miss_rows``), so an
  unknown id means the same on any number of ranks and in the serving bundle.
- Row-wise pooled lookups need as many rows on every rank (the backward all-gathers equal blocks): training batches
  are cut equal (recsys.data.batches.TrainBatches ``equal_shares``) and the evaluation pads shorter shares.

It also counts, per table: ids admitted into free rows, ids evicted for new ones (``managed_stats``), counts a
checkpoint keeps so that a resumed run counts on from them (``restore_counts``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.mc_embeddingbag import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
)
from torchrec.distributed.mc_modules import ManagedCollisionCollectionSharder, ShardedManagedCollisionCollection
from torchrec.modules.mc_modules import MCHManagedCollisionModule

from recsys.data.raw_ids import KEY_SPACE, hash_keys
from recsys.distributed.table_init import _block_seed

MANAGED_SHARDING = "row_wise"  # the one sharding type torchrec's ManagedCollisionCollectionSharder implements


@torch.no_grad()
def admitted_rows(keys: torch.Tensor, *, seed: int, table: str, num_rows: int, dim: int) -> torch.Tensor:
    """``len(keys) x dim`` float32 rows drawn from each id's key: U(-1/sqrt(num_rows), 1/sqrt(num_rows)), the bound
    of the vocabulary tables' init (recsys/distributed/table_init.py), from a hash of (seed, table, key, column)."""
    base = _block_seed(seed, table, -1)  # one 63-bit constant per (seed, table)
    columns = torch.arange(dim, dtype=torch.int64, device=keys.device)
    mixed = hash_keys(hash_keys(keys.to(torch.int64) ^ base)[:, None] + columns[None, :] * 0x632BE59BD9B4E019)
    unit = (mixed >> 11).to(torch.float64) / float(2**52)  # 52 high bits of the 63: uniform in [0, 1)
    bound = num_rows**-0.5
    return ((2.0 * unit - 1.0) * bound).to(torch.float32)


@dataclass
class TableCounts:
    admitted: int = 0  # ids given a row (a free one, or one whose id was evicted)
    evicted: int = 0  # ids that lost their row to a new one


class ShardedManagedEBC(ShardedManagedCollisionEmbeddingBagCollection):
    """torchrec's sharded MC-EBC with the admitted rows re-initialised on any device (see the module docstring)."""

    seed: int = 0  # trainer.seed: admitted rows are drawn from (seed, table, key)
    counts: dict[str, TableCounts]  # per table, this process's ranges, since the module was built
    open_slots: dict[str, int]  # per table, free rows in this rank's range at the last look

    def _evict(self, evictions_per_table: dict[str, torch.Tensor | None]) -> None:
        """Called by every lookup (training or not) before the rows are read: re-initialise the rows admitted this
        step, and keep each range's shared last row at 0."""
        self._reinit(evictions_per_table)
        zero_miss_rows(self)

    def _reinit(self, evictions_per_table: dict[str, torch.Tensor | None]) -> None:
        for table, rows in evictions_per_table.items():
            if rows is None or rows.numel() == 0:
                continue
            rows = rows.long()
            mcm = self._managed_collision_collection._managed_collision_modules[table]
            tbe, table_index = self._table_to_tbe_and_index[table]
            weights = tbe.split_embedding_weights()[int(table_index)]  # this rank's rows (a view)
            # the key now at each local row: the map holds (sorted keys, global rows)
            key_at_row = torch.empty(weights.shape[0], dtype=torch.int64, device=rows.device)
            key_at_row[mcm._mch_remapped_ids_mapping - mcm._output_global_offset] = mcm._mch_sorted_raw_ids
            config = self._embedding_module._table_name_to_config[table]
            weights[rows] = admitted_rows(
                key_at_row[rows], seed=self.seed, table=table, num_rows=config.num_embeddings, dim=weights.shape[1]
            ).to(weights.dtype)
            states = tbe.get_optimizer_state()  # per table: {"sum": ...} for (row-wise) Adagrad; none for SGD
            for state in states[int(table_index)].values() if states else ():
                state[rows] = 0
            counts = self.counts.setdefault(table, TableCounts())
            open_now = int(mcm.open_slots())
            filled = max(0, self.open_slots.get(table, open_now) - open_now)  # free rows taken this step
            counts.admitted += int(rows.numel())
            counts.evicted += int(rows.numel()) - filled
            self.open_slots[table] = open_now

    def refresh(self) -> None:
        """After weights and maps were loaded: the MCH modules re-read their step from the checkpoint, forget
        pending history, and the free rows are counted again."""
        for table, mcm in self._managed_collision_collection._managed_collision_modules.items():
            mcm._current_iter = -1
            mcm._evicted = False
            mcm._current_history_buffer_offset = 0
            self.open_slots[table] = int(mcm.open_slots())


class ManagedSharder(ManagedCollisionEmbeddingBagCollectionSharder):
    """Shards a ManagedCollisionEmbeddingBagCollection row-wise on CPU and CUDA into :class:`ShardedManagedEBC`."""

    def __init__(self, ebc_sharder: EmbeddingBagCollectionSharder, seed: int) -> None:
        super().__init__(ebc_sharder, ManagedCollisionCollectionSharder())
        self.seed = seed

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return [MANAGED_SHARDING]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return ["fused"]  # the admitted rows are written into the TBE's weights: no UVM cache in between

    def shard(self, module, params, env, device=None, module_fqn=None) -> ShardedManagedEBC:
        sharded = ShardedManagedEBC(
            module, params, ebc_sharder=self._e_sharder, mc_sharder=self._mc_sharder, env=env, device=device
        )
        sharded.seed, sharded.counts, sharded.open_slots = self.seed, {}, {}
        sharded.refresh()
        return sharded


def set_buckets(model: nn.Module, world_size: int) -> None:
    """Every MCH module of ``model`` (unsharded) in as many key buckets as ranks: the planner's requirement."""
    for module in model.modules():
        if isinstance(module, MCHManagedCollisionModule):
            module._buckets = world_size


def sharded_managed(dmp: nn.Module) -> Iterator[ShardedManagedEBC]:
    yield from (m for m in dmp.modules() if isinstance(m, ShardedManagedEBC))


@torch.no_grad()
def zero_miss_rows(dmp: nn.Module) -> None:
    """The last row of each rank's range of every managed table to 0: the row of every id the table does not hold
    (too many new ids for the free rows in one step, or an id first seen outside training), which then reads as
    "nothing known" whatever the number of ranks; the fused optimizer's update of it is undone before each lookup."""
    for sharded in sharded_managed(dmp) if not isinstance(dmp, ShardedManagedEBC) else [dmp]:
        for tbe, table_index in sharded._table_to_tbe_and_index.values():
            tbe.split_embedding_weights()[int(table_index)][-1].zero_()


@torch.no_grad()
def zero_managed_tables(dmp: nn.Module) -> None:
    """Managed rows start at 0: a row is drawn from its id when an id is admitted (``admitted_rows``), and the
    last row of each rank's range, which every id the table does not hold shares, stays 0 (zero_miss_rows)."""
    for sharded in sharded_managed(dmp):
        for tbe, table_index in sharded._table_to_tbe_and_index.values():
            tbe.split_embedding_weights()[int(table_index)].zero_()


def refresh_managed(dmp: nn.Module) -> None:
    for sharded in sharded_managed(dmp):
        sharded.refresh()


def restore_counts(dmp: nn.Module, counts: dict[str, dict[str, int]], rank: int) -> None:
    """The run's counts so far (``managed_stats``' admitted / evicted, saved with its checkpoint) as this process's
    starting counts: on rank 0, so that the sum over ranks is the run's whatever the number of ranks now."""
    for sharded in sharded_managed(dmp):
        for table in sharded._managed_collision_collection._managed_collision_modules:
            saved = counts.get(table, {}) if rank == 0 else {}
            sharded.counts[table] = TableCounts(int(saved.get("admitted", 0)), int(saved.get("evicted", 0)))


def managed_stats(dmp: nn.Module, world_size: int) -> dict[str, dict[str, int]]:
    """Collective: per managed table, summed over ranks: rows, ids held, ids admitted and evicted so far in this run."""
    names, values = [], []
    for sharded in sharded_managed(dmp):
        collection: ShardedManagedCollisionCollection = sharded._managed_collision_collection
        for table, mcm in collection._managed_collision_modules.items():
            counts = sharded.counts.get(table, TableCounts())
            held = int(mcm._zch_size) - 1 - int(mcm.open_slots())  # the last row of each range holds no id
            names.append(table)
            values.append([int(mcm._zch_size), held, counts.admitted, counts.evicted])
    if not names:
        return {}
    total = torch.tensor(values, dtype=torch.int64)
    if world_size > 1:
        dist.all_reduce(total)
    keys = ("rows", "ids", "admitted", "evicted")
    return {name: dict(zip(keys, (int(v) for v in row))) for name, row in zip(names, total.tolist())}


@torch.no_grad()
def full_id_maps(dmp: nn.Module, rank: int, world_size: int) -> dict:
    """Every managed table's key -> row map whole on rank 0 (collective; other ranks get an empty dict):
    ``{table: {"keys": int64 [n] ascending, "rows": int64 [n], "segments": [row offsets of the ranks' ranges..., rows]}}``.

    Keys are hashed raw ids (recsys/data/raw_ids.py); empty slots are left out. A key the map lacks falls in range
    ``key // ceil(KEY_SPACE / (len(segments) - 1))`` and gets that range's last row, as in the sharded model.
    """
    local: dict[str, tuple] = {}
    for sharded in sharded_managed(dmp):
        for table, mcm in sharded._managed_collision_collection._managed_collision_modules.items():
            keys = mcm._mch_sorted_raw_ids.cpu().numpy()
            held = keys != KEY_SPACE
            segments = [int(v) for v in mcm._output_segments_tensor.tolist() if v >= 0]
            local[table] = (keys[held], mcm._mch_remapped_ids_mapping.cpu().numpy()[held], segments)
    parts: list = [None] * world_size
    if world_size > 1:
        dist.all_gather_object(parts, local)
    else:
        parts = [local]
    if rank != 0:
        return {}
    out = {}
    for table, (_, _, segments) in local.items():
        keys = np.concatenate([p[table][0] for p in parts])
        rows = np.concatenate([p[table][1] for p in parts])
        order = np.argsort(keys, kind="stable")
        out[table] = {"keys": keys[order], "rows": rows[order], "segments": segments}
    return out
