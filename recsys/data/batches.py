"""Training batches: this rank's share of every epoch's seeded global batches.

Training example = one training interaction (u, i, t); its positive candidate is i. Its query is
the user plus a bag of at most ``history_length`` of u's training items, chosen by ``query_history``:

- ``recent``: the items u interacted with just before t (a sequential signal: temporal protocols);
- ``profile``: items of u's OTHER training interactions, a fresh random subset every epoch (so it
  acts as dropout); i itself is never in the bag. For random splits, where held-out items do not
  follow the training ones in time.

Evaluation's batches: recsys/data/eval_batches.py; both build through recsys/data/feature_builder.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from data_pipelines.errors import ConfigError
from recsys.data import arrays
from recsys.data.arrays import Array, on_device
from recsys.data.batch import Batch
from recsys.data.batch_bounds import batch_bounds, rank_shares
from recsys.data.dataset import Interactions, RetrievalData
from recsys.data.device_data import data_on_device, validate_sources
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.layout import CATEGORY, QUERY, FeatureLayout
from recsys.data.negatives import NegativeSampler
from recsys.data.prefetch import Prefetched
from recsys.data.ragged import gather_ranges, gather_rows


def _gathered_csr(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``gather_rows`` as a CSR of its own: (indptr int64 [len(rows) + 1], values)."""
    per_row, gathered = gather_rows(indptr, values, rows)
    return np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64), gathered


class ProfileOrder(NamedTuple):
    """An epoch's order of the training rows for profile bags (``TrainBatches.profile_order``); all but
    ``shuffled`` on the loader's device."""

    shuffled: np.ndarray  # training rows, each user's block in a random order
    position: Array  # each training row's position in ``shuffled``
    items: Array  # the item of each position
    category_indptr: Array | None  # CSR of the items' categories by position (None: not read)
    category_ids: Array | None

    def to(self, device: torch.device) -> ProfileOrder:
        return ProfileOrder(self.shuffled, *(on_device(a, device) for a in self[1:]))


class RowArrays(NamedTuple):
    """The training split's per-row arrays a batch reads, on the loader's device (numpy on the host)."""

    user_ids: Array
    item_ids: Array
    user_start: Array  # first row of each row's user
    user_end: Array  # one past its last
    category_indptr: Array  # CSR of each row's item's categories, by row (read by recent histories only)
    category_ids: Array

    def to(self, device: torch.device) -> RowArrays:
        return RowArrays(*(on_device(a, device) for a in self))


def _per_row(lengths: Array, values: Array) -> tuple[Array, Array]:
    """A gather over ``profile_ranges``' two ranges per row -> (per-row lengths, values)."""
    return lengths.reshape(-1, 2).sum(1), values


def _categories_in(starts: Array, ends: Array, order: ProfileOrder) -> tuple[Array, Array]:
    """The categories of the items at positions [starts, ends) of ``order``, per row (two ranges each)."""
    return _per_row(*gather_ranges(order.category_indptr[starts], order.category_indptr[ends], order.category_ids))


class RowPlan(NamedTuple):
    """What the batches of a run of rows (an epoch's order) read, per row, worked out once for all of them: a batch
    of rows [lo, hi) of it is slices, then one gather for its history bags and one for their categories."""

    user_ids: Array  # [n]
    item_ids: Array  # [n]: each row's positive
    # each row's history as ranges of ``hist_source`` (two per row, interleaved, for profile bags): [ranges * n]
    hist_starts: Array
    hist_ends: Array
    hist_source: Array
    # the ranges' categories as ranges of ``cat_source`` (None: the query reads no history categories)
    cat_starts: Array | None
    cat_ends: Array | None
    cat_source: Array | None
    ranges: int  # ranges per row: 1 (recent histories) or 2 (profile bags)


class TrainBatches:
    """This rank's share of every global batch of an epoch, in a seeded order.

    The epoch's order is a permutation drawn from (seed, epoch), identical on every rank; global
    batch b is rows [b*G, (b+1)*G) of it and rank r takes the r-th of its ``world_size`` slices
    (``rank_shares``: sizes differ by at most one row). Every training example is in exactly one
    batch of each epoch: the last, smaller batch holds the remainder (merged into the one before
    if it has fewer rows than there are ranks). Uniform negatives for batch b are drawn from
    (seed, epoch, b), so all ranks share them.

    Training examples are the training split's rows, except those of held-out users
    (strong_generalization: their rows are fold-in history for evaluation, never targets).

    **Per-rank data** (``rank_example_counts`` given: ``data.shard_by_user``): ``data`` holds only
    this rank's users, and ``rank_example_counts`` lists every rank's number of examples. The
    epoch has the global batch count of all examples (``batch_bounds``); rank r shuffles its own
    n_r examples with (seed, epoch, r) and gives batch b its rows ``[b n_r // S, (b+1) n_r // S)``
    of them (S batches), so each example is still in exactly one batch per epoch, and the batch
    says every rank's size (``Batch.rank_sizes``). The order depends on the world size.

    **Where batches are built** (``device``): None builds them with numpy on the host (pinned with
    ``pin_memory``, for a copy to a GPU); a torch device builds them there with torch ops from the training rows,
    bags and CSRs copied there once (``RowArrays``, recsys.data.device_data), their ids validated once whole. The
    epoch's orders and negatives are drawn on the host from the same seeds either way (a few arrays per epoch),
    so both give the same batches to the last id.
    """

    def __init__(
        self,
        data: RetrievalData,
        *,
        history_length: int,
        global_batch_size: int,
        num_negatives: int,
        seed: int,
        negative_exponent: float = 0.0,
        query_history: str = "recent",
        history_dropout: float = 0.0,
        user_id: bool = True,
        sequence: bool = False,
        query_neighbors: bool = False,
        layout: FeatureLayout | None = None,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
        pin_memory: bool = False,
        rank_example_counts: Sequence[int] | None = None,
        equal_shares: bool = False,
        device: torch.device | None = None,
    ) -> None:
        """``equal_shares``: every rank gets as many rows as the others in every batch (row-wise sharded tables,
        model.id_mapping=managed: torchrec's backward all-gathers equal blocks); the global batch size must divide
        by the world size, and the epoch's last batch drops its last ``len % world_size`` rows (different ones
        each epoch: the order is reshuffled). ``layout``: the run's FeatureLayout (recsys/data/layout.py); None: the
        one of ``history_length`` and the switches ``user_id``, ``sequence``, ``query_neighbors`` (FeatureBuilder)."""
        if global_batch_size < world_size:
            raise ValueError(
                f"trainer.global_batch_size={global_batch_size} is smaller than the world size {world_size}"
            )
        self.train: Interactions = data.splits["train"]
        self.data_on_host, self.device = data, device
        if device is not None:
            validate_sources(data)  # once whole: the batches' ids are then checked by construction
        source = data if device is None else data_on_device(data, device)
        self.builder = FeatureBuilder(
            source, history_length, user_id, sequence, query_neighbors, layout=layout, validate=device is None
        )
        history_length = self.builder.history_length
        self.num_items, self.global_batch_size, self.world_size = data.num_items, global_batch_size, world_size
        self.example_rows = data.example_rows()
        self.rank_example_counts = None if rank_example_counts is None else [int(n) for n in rank_example_counts]
        self.bounds = self._epoch_bounds(equal_shares, rank)
        self.seed, self.rank = seed, rank
        self.negatives = NegativeSampler(num_negatives, negative_exponent, data.num_items, data.example_item_counts)
        self.history_length = history_length
        if query_history not in ("recent", "profile"):
            raise ValueError(f"data.query_history={query_history!r}: expected 'recent' or 'profile'")
        self.query_history, self.history_dropout = query_history, history_dropout
        self.uses_profile = query_history == "profile" and history_length > 0
        self.history_categories = self.builder.layout.spec(CATEGORY, QUERY) is not None
        self.rows = self._row_arrays(data)
        self.prefetch = prefetch
        self.pin_memory = pin_memory  # GPU: page-locked batches, so the copy to the device can be asynchronous

    def _row_arrays(self, data: RetrievalData) -> RowArrays:
        """The training rows' arrays on the loader's device. The categories of every row's item come in row order: a
        recent history (rows [s, e)) then has its categories in one contiguous range, with no per-item gather."""
        self.user_start, self.user_end = user_row_bounds(self.train.user_ids)
        contiguous = self.history_categories and self.query_history == "recent"
        rows_with_history = self.train.item_ids if contiguous else self.train.item_ids[:0]
        rows = RowArrays(
            self.train.user_ids,
            self.train.item_ids,
            self.user_start,
            self.user_end,
            *_gathered_csr(data.item_category_indptr, data.item_category_ids, rows_with_history),
        )
        return rows if self.device is None else rows.to(self.device)

    def _epoch_bounds(self, equal_shares: bool, rank: int) -> np.ndarray:
        """The global batches' row bounds in the epoch's order (``batch_bounds``), the per-rank counts checked."""
        global_batch_size, world_size, counts = self.global_batch_size, self.world_size, self.rank_example_counts
        total = len(self.example_rows) if counts is None else sum(counts)
        if total < global_batch_size:
            raise ConfigError(f"trainer.global_batch_size={global_batch_size} exceeds the {total} training examples")
        bounds = batch_bounds(total, global_batch_size, world_size)
        if equal_shares and world_size > 1:
            if global_batch_size % world_size or counts is not None:
                raise ValueError(
                    f"trainer.global_batch_size={global_batch_size}: row-wise sharded tables (model.id_mapping=managed) "
                    f"need equal rows on every rank: a multiple of the {world_size} ranks, without data.shard_by_user"
                )
            bounds[-1] -= (bounds[-1] - bounds[-2]) % world_size
        if counts is not None:
            if len(counts) != world_size or counts[rank] != len(self.example_rows):
                raise ValueError(
                    f"rank_example_counts={counts}: expected {world_size} counts, this rank's = {len(self.example_rows)}"
                )
            if min(counts) < len(bounds) - 1:
                r = int(np.argmin(counts))
                raise ValueError(
                    f"rank {r} holds {counts[r]} training examples, fewer than the {len(bounds) - 1} batches of an epoch: "
                    f"use a larger trainer.global_batch_size, fewer ranks, or data.shard_by_user=false"
                )
        return bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def profile_order(self, epoch: int) -> ProfileOrder:
        """The epoch's profile order: the training rows with each user's rows in a random order drawn from
        (seed, epoch) (users stay in their contiguous blocks), each row's position in it, and the items (and, when
        the query reads the history's categories, their categories) in that order, so that a bag is at most two
        contiguous ranges of them."""
        n = len(self.train)
        keys = np.random.default_rng([self.seed, epoch, 0x9E37]).random(n)
        shuffled = np.lexsort((keys, self.train.user_ids))
        position = np.empty(n, dtype=np.int64)
        position[shuffled] = np.arange(n, dtype=np.int64)
        items = self.train.item_ids[shuffled]
        category_indptr = category_ids = None
        if self.history_categories:  # once an epoch, instead of a per-item gather in every batch
            data = self.data_on_host
            category_indptr, category_ids = _gathered_csr(data.item_category_indptr, data.item_category_ids, items)
        order = ProfileOrder(shuffled, position, items, category_indptr, category_ids)
        return order if self.device is None else order.to(self.device)

    def profile_ranges(self, rows: Array, order: ProfileOrder) -> tuple[Array, Array]:
        """Each row's profile as two ranges of positions in ``order`` (the second possibly empty), interleaved:
        (starts, ends) of length 2 x len(rows).

        The positions that follow the row's in its user's shuffled block, wrapping around to the block's start:
        up to ``history_length`` distinct rows, never the row itself, a different subset each epoch when the user
        has more than the cap.
        """
        start, end = self.rows.user_start[rows], self.rows.user_end[rows]
        others = end - start - 1
        lengths = others.clip(max=self.history_length)
        if self.history_dropout > 0:  # keep a share of the bag, at least one item when there is one
            kept = arrays.floor_scaled(others, 1.0 - self.history_dropout).clip(min=1)
            lengths = arrays.minimum(lengths, kept)
        first = order.position[rows] + 1
        first_end = arrays.minimum(first + lengths, end)
        wrap = lengths - (first_end - first)
        return arrays.interleave(first, start), arrays.interleave(first_end, start + wrap)

    def profile_bags(self, rows: Array, order: ProfileOrder) -> tuple[Array, Array]:
        """Each row's profile (``profile_ranges``): (lengths, items)."""
        return _per_row(*gather_ranges(*self.profile_ranges(rows, order), order.items))

    def profile_categories(self, rows: Array, order: ProfileOrder) -> tuple[Array, Array]:
        """The categories of each row's profile items, in bag order: (per-row lengths, values)."""
        return _categories_in(*self.profile_ranges(rows, order), order)

    def plan(self, rows: Array, profile_order: ProfileOrder | None = None) -> RowPlan:
        """The ``RowPlan`` of ``rows`` (their profile bags drawn from ``profile_order``: the epoch's)."""
        t = self.rows
        cat_starts = cat_ends = cat_source = None
        if self.uses_profile:
            if profile_order is None:
                raise ValueError("TrainBatches: query_history='profile' needs the epoch's profile_order")
            starts, ends = self.profile_ranges(rows, profile_order)  # once for the items and their categories
            source, ranges = profile_order.items, 2
            if self.history_categories:
                indptr = profile_order.category_indptr
                cat_starts, cat_ends, cat_source = indptr[starts], indptr[ends], profile_order.category_ids
        else:
            ends = rows
            starts = arrays.maximum(t.user_start[rows], rows - self.history_length)
            source, ranges = t.item_ids, 1
            if self.history_categories:
                cat_starts, cat_ends, cat_source = t.category_indptr[starts], t.category_indptr[ends], t.category_ids
        return RowPlan(
            arrays.take(t.user_ids, rows),
            arrays.take(t.item_ids, rows),
            starts,
            ends,
            source,
            cat_starts,
            cat_ends,
            cat_source,
            ranges,
        )

    def batch(
        self,
        rows: Array,
        negatives: Array,
        global_num_queries: int = 0,
        rank_sizes: tuple[int, ...] | None = None,
        profile_order: ProfileOrder | None = None,
    ) -> Batch:
        """The batch of ``rows`` with ``negatives`` (``profile_order``: the epoch's, for profile bags)."""
        return self.batch_of_plan(
            self.plan(rows, profile_order), 0, len(rows), negatives, global_num_queries or len(rows), rank_sizes
        )

    def batch_of_plan(
        self,
        plan: RowPlan,
        lo: int,
        hi: int,
        negatives: Array,
        global_num_queries: int,
        rank_sizes: tuple[int, ...] | None = None,
    ) -> Batch:
        """The batch of rows [lo, hi) of ``plan``: slices of it, the bags' two gathers, the KJT."""
        ranges = slice(plan.ranges * lo, plan.ranges * hi)
        hist_lengths, hist_items = gather_ranges(plan.hist_starts[ranges], plan.hist_ends[ranges], plan.hist_source)
        hist_categories = None
        if plan.cat_source is not None:
            hist_categories = gather_ranges(plan.cat_starts[ranges], plan.cat_ends[ranges], plan.cat_source)
        if plan.ranges == 2:  # a profile bag's two ranges summed
            hist_lengths = _per_row(hist_lengths, hist_items)[0]
            if hist_categories is not None:
                hist_categories = _per_row(*hist_categories)
        batch = self.builder.build(
            user_ids=plan.user_ids[lo:hi],
            hist_lengths=hist_lengths,
            hist_items=hist_items,
            candidate_item_ids=arrays.concat([plan.item_ids[lo:hi], negatives]),
            hist_categories=hist_categories,
        )
        batch.global_num_queries = global_num_queries
        batch.rank_sizes = rank_sizes
        return batch

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[Batch]:
        """Batches ``start_batch, start_batch + 1, ...`` of ``epoch``, in order.

        With ``prefetch > 0`` they are built by a background thread up to ``prefetch`` batches
        ahead of the consumer (numpy releases the GIL in the gathers, so building overlaps the
        step); the order and contents are those of ``prefetch=0``, errors surface at the batch
        that raised them, and dropping the iterator stops the thread.
        """
        batches = self._build_epoch(epoch, start_batch)
        return Prefetched(batches, self.prefetch, self.device) if self.prefetch > 0 else batches

    def _epoch_negatives(self, epoch: int, start_batch: int) -> Callable[[int], Array]:
        """Batch b's negatives (on the device): drawn from (seed, epoch, b); the whole catalogue, the same each step."""
        place = (lambda a: a) if self.device is None else (lambda a: on_device(a, self.device))
        if self.negatives.whole_catalogue:
            catalogue = place(np.arange(self.num_items, dtype=np.int64))
            return lambda b: catalogue
        num = max(self.negatives.num, 0)
        negatives = np.zeros((len(self) - start_batch, num), dtype=np.int64)
        for b in range(start_batch, len(self) if num else start_batch):
            negatives[b - start_batch] = self.negatives.draw(np.random.default_rng([self.seed, epoch, b]))
        negatives = place(negatives)
        return lambda b: negatives[b - start_batch]

    def _build_epoch(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        per_rank = self.rank_example_counts is not None
        seed = [self.seed, epoch, self.rank] if per_rank else [self.seed, epoch]
        order = self.example_rows[np.random.default_rng(seed).permutation(len(self.example_rows))]
        if self.device is not None:  # one copy an epoch; each batch's rows are a slice of it
            order = on_device(order, self.device)
        profile = self.profile_order(epoch) if self.uses_profile else None
        negatives = self._epoch_negatives(epoch, start_batch)
        plan = self.plan(order, profile)  # each batch is a slice of it
        num_batches = len(self)
        for b in range(start_batch, num_batches):
            rank_sizes = None
            if per_rank:
                rank_sizes = tuple((b + 1) * n // num_batches - b * n // num_batches for n in self.rank_example_counts)
                lo = b * len(order) // num_batches
                hi, global_size = lo + rank_sizes[self.rank], sum(rank_sizes)
            else:
                shares = rank_shares(int(self.bounds[b + 1] - self.bounds[b]), self.world_size)
                lo = int(self.bounds[b]) + sum(shares[: self.rank])
                hi, global_size = lo + shares[self.rank], sum(shares)
            batch = self.batch_of_plan(plan, lo, hi, negatives(b), global_size, rank_sizes)
            yield batch.pin_memory() if self.pin_memory else batch


def user_row_bounds(users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end): the first row of each row's user and one past its last (rows sorted by user); O(rows), never
    O(num_users)."""
    new_user = np.concatenate([[True], users[1:] != users[:-1]]) if len(users) else np.zeros(0, dtype=bool)
    starts = np.nonzero(new_user)[0]
    return starts[np.cumsum(new_user) - 1], np.append(starts[1:], len(users))[np.cumsum(new_user) - 1]
