"""Turn interactions into Batches: training batches per rank, and eval batches of users / items.

Training example = one training interaction (u, i, t); its positive candidate is i. Its query is
the user plus a bag of at most ``history_length`` of u's training items, chosen by ``query_history``:

- ``recent``: the items u interacted with just before t (a sequential signal: temporal protocols);
- ``profile``: items of u's OTHER training interactions, a fresh random subset every epoch (so it
  acts as dropout); i itself is never in the bag. For random splits, where held-out items do not
  follow the training ones in time.

At evaluation, a user's bag is their latest ``history_length`` items in the splits that precede
the evaluated one (train for valid; train + valid for test), for both choices.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from data_pipelines.errors import ConfigError
from recsys.data.batch import Batch
from recsys.data.batch_bounds import batch_bounds, rank_shares
from recsys.data.dataset import Interactions, RetrievalData
from recsys.data.features import build_kjt, validate_ids
from recsys.data.layout import CANDIDATE, CATEGORY, QUERY, FeatureLayout, data_layout
from recsys.data.ragged import gather_ranges, gather_rows
from recsys.data.row_sources import ROW_SOURCES, BatchArrays

# KJT keys of the managed tables (recsys/model/managed.py) -> whose raw ids their values become
RAW_ID_KEYS = {"user": "user", "item": "item", "neighbor": "item"}


def raw_id_values(data: RetrievalData, values: dict) -> dict:
    """``values`` (indices, validated) with the managed keys' ids turned into the raw ids the managed tables read."""
    raw = {"user": data.raw_user_ids, "item": data.raw_item_ids}
    return {k: raw[RAW_ID_KEYS[k]][v] if k in RAW_ID_KEYS else v for k, v in values.items()}


class FeatureBuilder:
    """Builds validated KJT batches from user / history / item arrays: one key per key of its ``layout``
    (recsys/data/layout.py), each tower's rows filled by its entry's row source (recsys/data/row_sources.py)."""

    def __init__(
        self,
        data: RetrievalData,
        history_length: int = 0,
        user_id: bool = True,
        sequence: bool = False,
        query_neighbors: bool = False,
        *,
        layout: FeatureLayout | None = None,
    ) -> None:
        """``layout``: the run's (recsys.data.layout.run_layout); None: the layout of ``history_length`` and the
        switches (recsys.config.query_layout's keyword arguments) over ``data`` (``data_layout``)."""
        self.data = data
        self.layout = layout or data_layout(
            data, history_length, user_id=user_id, sequence=sequence, query_neighbors=query_neighbors
        )
        self.history_length = self.layout.history_length
        self.keys = self.layout.keys()
        # each key's (query entry, candidate entry); None: that tower's rows are empty
        self.slots = [(self.layout.spec(k, QUERY), self.layout.spec(k, CANDIDATE)) for k in self.keys]

    def build(
        self,
        *,
        user_ids: np.ndarray,
        hist_lengths: np.ndarray,
        hist_items: np.ndarray,
        candidate_item_ids: np.ndarray,
        hist_categories: Tuple[np.ndarray, np.ndarray] | None = None,
    ) -> Batch:
        """Query rows for ``user_ids`` (with their histories), then one candidate row per item.

        ``hist_categories``: (per-query lengths, values) of the history items' categories when the
        caller has them already (``TrainBatches``: contiguous ranges of a row-aligned copy);
        otherwise they are gathered from the item -> categories CSR.
        """
        # ids first: they index the category and side columns, and numpy would wrap a negative one
        sizes = self.data.table_num_rows
        validate_ids("user_id", user_ids, sizes["user"])
        validate_ids("history_item_ids", hist_items, sizes["item"])
        validate_ids("item_id", candidate_item_ids, sizes["item"])
        if self.history_length <= 0:  # no history feature: empty bags on query rows
            hist_lengths, hist_items = np.zeros(len(user_ids), dtype=np.int64), hist_items[:0]
            hist_categories = None
        arrays = BatchArrays(
            self.data, user_ids, hist_lengths, hist_items, candidate_item_ids, hist_categories, num_rows=sizes
        )
        lengths, values = {}, {}
        for key, towers in zip(self.keys, self.slots):  # each key's values in row order: queries', candidates'
            parts = [
                ROW_SOURCES[spec.source](arrays, spec) if spec is not None else _empty(count)
                for spec, count in zip(towers, (len(user_ids), len(candidate_item_ids)))
            ]
            lengths[key] = np.concatenate([parts[0][0], parts[1][0]])
            values[key] = np.concatenate([parts[0][1], parts[1][1]])
        if self.data.raw_item_ids is not None:  # model.id_mapping=managed: the managed tables read raw ids
            values = raw_id_values(self.data, values)
        return Batch(
            features=build_kjt(self.keys, lengths, values),
            candidate_item_ids=torch.from_numpy(np.ascontiguousarray(candidate_item_ids, dtype=np.int64)),
            num_queries=len(user_ids),
        )


def _empty(num_rows: int) -> Tuple[np.ndarray, np.ndarray]:
    return np.zeros(num_rows, dtype=np.int64), np.zeros(0, dtype=np.int64)


def _gathered_csr(indptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``gather_rows`` as a CSR of its own: (indptr int64 [len(rows) + 1], values)."""
    per_row, gathered = gather_rows(indptr, values, rows)
    return np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64), gathered


class ProfileOrder(NamedTuple):
    """An epoch's order of the training rows for profile bags (``TrainBatches.profile_order``)."""

    shuffled: np.ndarray  # training rows, each user's block in a random order
    position: np.ndarray  # each training row's position in ``shuffled``
    items: np.ndarray  # the item of each position
    category_indptr: Optional[np.ndarray]  # CSR of the items' categories by position (None: not read)
    category_ids: Optional[np.ndarray]


def _per_row(lengths: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """A gather over ``profile_ranges``' two ranges per row -> (per-row lengths, values)."""
    return lengths.reshape(-1, 2).sum(axis=1), values


def _categories_in(starts: np.ndarray, ends: np.ndarray, order: ProfileOrder) -> Tuple[np.ndarray, np.ndarray]:
    """The categories of the items at positions [starts, ends) of ``order``, per row (two ranges each)."""
    return _per_row(*gather_ranges(order.category_indptr[starts], order.category_indptr[ends], order.category_ids))


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
    """

    def __init__(
        self,
        data: RetrievalData,
        *,
        history_length: int,
        global_batch_size: int,
        num_uniform_negatives: int,
        seed: int,
        query_history: str = "recent",
        history_dropout: float = 0.0,
        user_id: bool = True,
        sequence: bool = False,
        query_neighbors: bool = False,
        layout: Optional[FeatureLayout] = None,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
        pin_memory: bool = False,
        rank_example_counts: Optional[Sequence[int]] = None,
        equal_shares: bool = False,
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
        self.builder = FeatureBuilder(data, history_length, user_id, sequence, query_neighbors, layout=layout)
        history_length = self.builder.history_length
        self.num_items = data.num_items
        self.global_batch_size = global_batch_size
        self.world_size = world_size
        self.example_rows = data.example_rows()
        self.rank_example_counts = None if rank_example_counts is None else [int(n) for n in rank_example_counts]
        self.bounds = self._epoch_bounds(equal_shares, rank)
        self.num_uniform_negatives = num_uniform_negatives
        self.seed, self.rank = seed, rank
        self.history_length = history_length
        if query_history not in ("recent", "profile"):
            raise ValueError(f"data.query_history={query_history!r}: expected 'recent' or 'profile'")
        self.query_history = query_history
        self.uses_profile = query_history == "profile" and history_length > 0
        self.history_dropout = history_dropout
        self.user_start, self.user_end = user_row_bounds(self.train.user_ids)
        # the categories of every training row's item, in row order: a history (rows [s, e)) then
        # has its categories in one contiguous range, and a batch needs no per-item gather (the
        # item -> categories gather was ~5 ms of a 7 ms batch at 2048 x 100 history items)
        self.history_categories = self.builder.layout.spec(CATEGORY, QUERY) is not None
        contiguous = self.history_categories and query_history == "recent"
        rows_with_history = self.train.item_ids if contiguous else self.train.item_ids[:0]
        self.row_category_indptr, self.row_category_ids = _gathered_csr(
            data.item_category_indptr, data.item_category_ids, rows_with_history
        )
        self.prefetch = prefetch
        self.pin_memory = pin_memory  # GPU: page-locked batches, so the copy to the device can be asynchronous

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
            data = self.builder.data
            category_indptr, category_ids = _gathered_csr(data.item_category_indptr, data.item_category_ids, items)
        return ProfileOrder(shuffled, position, items, category_indptr, category_ids)

    def profile_ranges(self, rows: np.ndarray, order: ProfileOrder) -> Tuple[np.ndarray, np.ndarray]:
        """Each row's profile as two ranges of positions in ``order`` (the second possibly empty), interleaved:
        (starts, ends) of length 2 x len(rows).

        The positions that follow the row's in its user's shuffled block, wrapping around to the block's start:
        up to ``history_length`` distinct rows, never the row itself, a different subset each epoch when the user
        has more than the cap.
        """
        start, end = self.user_start[rows], self.user_end[rows]
        lengths = np.minimum(self.history_length, end - start - 1)
        if self.history_dropout > 0:  # keep a share of the bag, at least one item when there is one
            lengths = np.minimum(
                lengths, np.maximum(1, np.floor((1.0 - self.history_dropout) * (end - start - 1)).astype(np.int64))
            )
        first = order.position[rows] + 1
        first_end = np.minimum(first + lengths, end)
        wrap = lengths - (first_end - first)
        return np.stack([first, start], axis=1).reshape(-1), np.stack([first_end, start + wrap], axis=1).reshape(-1)

    def profile_bags(self, rows: np.ndarray, order: ProfileOrder) -> Tuple[np.ndarray, np.ndarray]:
        """Each row's profile (``profile_ranges``): (lengths, items)."""
        return _per_row(*gather_ranges(*self.profile_ranges(rows, order), order.items))

    def profile_categories(self, rows: np.ndarray, order: ProfileOrder) -> Tuple[np.ndarray, np.ndarray]:
        """The categories of each row's profile items, in bag order: (per-row lengths, values)."""
        return _categories_in(*self.profile_ranges(rows, order), order)

    def batch(
        self,
        rows: np.ndarray,
        negatives: np.ndarray,
        global_num_queries: int = 0,
        rank_sizes: Optional[Tuple[int, ...]] = None,
        profile_order: Optional[ProfileOrder] = None,
    ) -> Batch:
        t = self.train
        hist_categories = None
        if self.uses_profile:
            if profile_order is None:
                raise ValueError("TrainBatches.batch: query_history='profile' needs the epoch's profile_order")
            starts, ends = self.profile_ranges(rows, profile_order)  # once for the items and their categories
            hist_lengths, hist_items = _per_row(*gather_ranges(starts, ends, profile_order.items))
            if self.history_categories:
                hist_categories = _categories_in(starts, ends, profile_order)
        else:
            ends = rows
            starts = np.maximum(self.user_start[rows], rows - self.history_length)
            hist_lengths, hist_items = gather_ranges(starts, ends, t.item_ids)
            if self.history_categories:
                indptr = self.row_category_indptr
                hist_categories = gather_ranges(indptr[starts], indptr[ends], self.row_category_ids)
        batch = self.builder.build(
            user_ids=t.user_ids[rows],
            hist_lengths=hist_lengths,
            hist_items=hist_items,
            candidate_item_ids=np.concatenate([t.item_ids[rows], negatives]),
            hist_categories=hist_categories,
        )
        batch.global_num_queries = global_num_queries or len(rows)
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
        return _Prefetched(batches, self.prefetch) if self.prefetch > 0 else batches

    def _build_epoch(self, epoch: int, start_batch: int) -> Iterator[Batch]:
        per_rank = self.rank_example_counts is not None
        seed = [self.seed, epoch, self.rank] if per_rank else [self.seed, epoch]
        order = self.example_rows[np.random.default_rng(seed).permutation(len(self.example_rows))]
        profile = self.profile_order(epoch) if self.uses_profile else None
        num_batches = len(self)
        for b in range(start_batch, num_batches):
            rank_sizes = None
            if per_rank:
                rank_sizes = tuple((b + 1) * n // num_batches - b * n // num_batches for n in self.rank_example_counts)
                lo = b * len(order) // num_batches
                rows, global_size = order[lo : lo + rank_sizes[self.rank]], sum(rank_sizes)
            else:
                global_rows = order[self.bounds[b] : self.bounds[b + 1]]
                shares = rank_shares(len(global_rows), self.world_size)
                first = sum(shares[: self.rank])
                rows, global_size = global_rows[first : first + shares[self.rank]], len(global_rows)
            negatives = np.random.default_rng([self.seed, epoch, b]).integers(
                0, self.num_items, self.num_uniform_negatives, dtype=np.int64
            )
            batch = self.batch(
                rows, negatives, global_num_queries=global_size, rank_sizes=rank_sizes, profile_order=profile
            )
            yield batch.pin_memory() if self.pin_memory else batch


class _Prefetched:
    """Iterate ``source`` on a daemon thread through a queue of at most ``depth`` items."""

    _DONE = object()

    def __init__(self, source: Iterator[Batch], depth: int) -> None:
        self._queue: "queue.Queue" = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(source,), name="TrainBatches-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[Batch]) -> None:
        try:
            for batch in source:
                if not self._put(batch):
                    return
            self._put((self._DONE, None))
        except BaseException as e:  # handed to the consumer, raised at this batch
            self._put((self._DONE, e))

    def __iter__(self) -> "_Prefetched":
        return self

    def __next__(self) -> Batch:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, tuple) and item[0] is self._DONE:
            self._finished = True
            self.close()
            if item[1] is not None:
                raise item[1]
            raise StopIteration
        return item

    def close(self) -> None:
        self._stop.set()

    def __del__(self) -> None:
        self._stop.set()


def user_row_bounds(users: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(start, end): the first row of each row's user and one past its last (rows sorted by user); O(rows), never
    O(num_users)."""
    new_user = np.concatenate([[True], users[1:] != users[:-1]]) if len(users) else np.zeros(0, dtype=bool)
    starts = np.nonzero(new_user)[0]
    return starts[np.cumsum(new_user) - 1], np.append(starts[1:], len(users))[np.cumsum(new_user) - 1]


def latest_items(
    timeline: Interactions, users: np.ndarray, num_users: int, history_length: int
) -> Tuple[np.ndarray, np.ndarray]:
    """Each user's ``history_length`` latest items in ``timeline``: (lengths, items), oldest first."""
    bounds = timeline.user_bounds(num_users)
    ends = bounds[users + 1]
    starts = np.maximum(bounds[users], ends - history_length)
    return gather_ranges(starts, ends, timeline.item_ids)


def query_batches(
    builder: FeatureBuilder, users: np.ndarray, timeline: Interactions, batch_size: int
) -> Iterator[Batch]:
    """Query-only batches for ``users`` with histories taken from ``timeline``."""
    num_users = builder.data.num_users
    for lo in range(0, len(users), batch_size):
        chunk = users[lo : lo + batch_size]
        hist_lengths, hist_items = latest_items(timeline, chunk, num_users, builder.history_length)
        yield builder.build(
            user_ids=chunk,
            hist_lengths=hist_lengths,
            hist_items=hist_items,
            candidate_item_ids=np.zeros(0, dtype=np.int64),
        )


def item_batches(builder: FeatureBuilder, item_ids: np.ndarray, batch_size: int) -> Iterator[Batch]:
    """Candidate-only batches (no queries) for ``item_ids``."""
    empty = np.zeros(0, dtype=np.int64)
    for lo in range(0, len(item_ids), batch_size):
        yield builder.build(
            user_ids=empty, hist_lengths=empty, hist_items=empty, candidate_item_ids=item_ids[lo : lo + batch_size]
        )
