"""Batches: ids validated before lookup, histories equal a naive loop, ranks split each global batch."""

import dataclasses

import numpy as np
import pytest
import torch

from recsys.data.batches import TrainBatches
from recsys.data.dataset import Interactions
from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.features import validate_kjt
from recsys.data.ragged import gather_ranges, segment_sum


def test_gather_ranges_and_segment_sum_match_loops():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 100, 50)
    starts = rng.integers(0, 50, 20)
    ends = np.minimum(50, starts + rng.integers(0, 6, 20))
    lengths, got = gather_ranges(starts, ends, values)
    expected = [v for s, e in zip(starts, ends) for v in values[s:e]]
    assert got.tolist() == expected and lengths.tolist() == (ends - starts).tolist()
    inner = rng.integers(0, 4, 12)
    outer = np.array([3, 0, 5, 4])
    assert segment_sum(inner, outer).tolist() == [inner[:3].sum(), 0, inner[3:8].sum(), inner[8:].sum()]


def test_training_history_is_the_users_previous_items(tiny_data):
    history_length = 4
    batches = TrainBatches(tiny_data, history_length=history_length, global_batch_size=64, num_negatives=3, seed=0)
    batch = next(batches.epoch(0))
    features = batch.features.to_dict()
    train = tiny_data.splits["train"]
    order = np.random.default_rng([0, 0]).permutation(len(train))[:64]
    hist, cats = features["item"], features["category"]  # query rows [0, 64): the history
    for j, row in enumerate(order):
        u = train.user_ids[row]
        earlier = [i for i in range(row) if train.user_ids[i] == u]  # rows are sorted by (user, time)
        expected = train.item_ids[earlier[-history_length:]].tolist() if earlier else []
        got = hist.values()[hist.offsets()[j] : hist.offsets()[j + 1]].tolist()
        assert got == expected
        got_cats = cats.values()[cats.offsets()[j] : cats.offsets()[j + 1]].tolist()
        expected_cats = [
            c
            for i in expected
            for c in tiny_data.item_category_ids[
                tiny_data.item_category_indptr[i] : tiny_data.item_category_indptr[i + 1]
            ]
        ]
        assert got_cats == expected_cats
    assert batch.num_queries == 64 and batch.candidate_item_ids.numel() == 64 + 3
    assert batch.candidate_item_ids[:64].tolist() == train.item_ids[order].tolist()
    # the bags again beside the KJT, as dataset indices (what model.loss.mask_history compares with the candidates')
    assert batch.history_lengths.tolist() == hist.lengths()[:64].tolist()
    assert batch.history_items.tolist() == hist.values()[: hist.offsets()[64]].tolist()
    # candidate rows [64, 131): no user, one item each (the positives, then the negatives), its categories
    assert batch.features.stride() == 64 + 67
    assert features["user"].lengths()[64:].sum() == 0 and features["user"].lengths()[:64].tolist() == [1] * 64
    assert hist.lengths()[64:].tolist() == [1] * 67
    assert hist.values()[hist.offsets()[64] :].tolist() == batch.candidate_item_ids.tolist()
    for j, item in enumerate(batch.candidate_item_ids.tolist()):
        got_cats = cats.values()[cats.offsets()[64 + j] : cats.offsets()[65 + j]].tolist()
        assert (
            got_cats
            == tiny_data.item_category_ids[
                tiny_data.item_category_indptr[item] : tiny_data.item_category_indptr[item + 1]
            ].tolist()
        )


def test_the_bags_beside_the_kjt_stay_dataset_indices_under_managed_ids(tiny_data):
    """model.id_mapping=managed: the KJT holds raw ids; the batch's bags, like its candidates' ids, stay indices."""
    raw = dataclasses.replace(
        tiny_data,
        raw_user_ids=np.arange(tiny_data.num_users, dtype=np.int64) * 7 + 10**12,
        raw_item_ids=np.arange(tiny_data.num_items, dtype=np.int64) * 3 + 10**12,
    )
    batch = next(TrainBatches(raw, history_length=4, global_batch_size=64, num_negatives=3, seed=0).epoch(0))
    plain = next(TrainBatches(tiny_data, history_length=4, global_batch_size=64, num_negatives=3, seed=0).epoch(0))
    hist = batch.features.to_dict()["item"]
    assert torch.equal(batch.history_items, plain.history_items) and torch.equal(
        batch.history_lengths, plain.history_lengths
    )
    assert (hist.values()[: hist.offsets()[64]] - 10**12).div(3).tolist() == batch.history_items.tolist()
    assert batch.history_items.numel() > 64


def test_ranks_split_every_global_batch_and_share_negatives(tiny_data):
    kwargs = dict(history_length=3, global_batch_size=97, num_negatives=5, seed=7, prefetch=0)
    single = TrainBatches(tiny_data, **kwargs)
    ranks = [TrainBatches(tiny_data, rank=r, world_size=3, **kwargs) for r in range(3)]
    assert len(single) == len(ranks[0]) == -(-len(tiny_data.splits["train"]) // 97)
    for b, (whole, *parts) in enumerate(zip(single.epoch(1), *(r.epoch(1) for r in ranks))):
        n = whole.num_queries
        sizes = [p.num_queries for p in parts]
        assert sizes == [n // 3 + (r < n % 3) for r in range(3)] and all(p.global_num_queries == n for p in parts)
        positives = torch.cat([p.candidate_item_ids[: p.num_queries] for p in parts])
        assert torch.equal(positives, whole.candidate_item_ids[:n])
        for p in parts:
            assert torch.equal(p.candidate_item_ids[p.num_queries :], whole.candidate_item_ids[n:])
        if b == 3:
            break


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_example_is_seen_exactly_once_per_epoch(tiny_data, world_size):
    """The ranks' batches of an epoch partition the training split: no row lost, none repeated."""
    train = tiny_data.splits["train"]
    seen = []
    for rank in range(world_size):
        batches = TrainBatches(
            tiny_data,
            history_length=0,
            global_batch_size=1001,
            num_negatives=0,
            seed=3,
            rank=rank,
            world_size=world_size,
            prefetch=0,
        )
        for batch in batches.epoch(2):
            seen.append(batch.candidate_item_ids.numpy() * 1_000_000 + batch.features["user"].values().numpy())
    seen = np.sort(np.concatenate(seen))
    expected = np.sort(train.item_ids * 1_000_000 + train.user_ids)
    assert np.array_equal(seen, expected)  # (user, item) pairs are unique in the split


def test_batch_bounds_merge_a_remainder_smaller_than_the_world():
    from recsys.data.batch_bounds import batch_bounds, rank_shares

    assert batch_bounds(10, 4, 3).tolist() == [0, 4, 10]  # 2 leftover rows < 3 ranks: merged
    assert batch_bounds(11, 4, 3).tolist() == [0, 4, 8, 11]
    assert batch_bounds(8, 4, 2).tolist() == [0, 4, 8]
    assert rank_shares(7, 3) == [3, 2, 2] and rank_shares(6, 3) == [2, 2, 2]


def test_latest_items_are_the_last_of_each_users_timeline():
    timeline = Interactions(np.array([0, 0, 0, 2, 2]), np.array([5, 6, 7, 1, 2]), np.array([1, 2, 3, 1, 2]))
    lengths, items = latest_items(timeline, np.array([2, 1, 0]), num_users=3, history_length=2)
    assert lengths.tolist() == [2, 0, 2] and items.tolist() == [1, 2, 6, 7]


def test_out_of_range_and_negative_ids_raise_before_lookup(tiny_data):
    builder = FeatureBuilder(tiny_data, history_length=2)
    ok = dict(
        user_ids=np.array([0, 1]),
        hist_lengths=np.array([1, 0]),
        hist_items=np.array([1]),
        candidate_item_ids=np.array([2, 3]),
    )
    builder.build(**ok)
    with pytest.raises(ValueError, match=r"feature 'item_id': id 300 is out of range for table 'item' of 300 rows"):
        builder.build(**{**ok, "candidate_item_ids": np.array([2, 300])})
    with pytest.raises(
        ValueError, match=r"feature 'history_item_ids': id -1 is negative \(table 'item' has 300 rows\)"
    ):
        builder.build(**{**ok, "hist_items": np.array([-1])})
    with pytest.raises(ValueError, match=r"feature 'user_id': id 400 is out of range for table 'user' of 400 rows"):
        builder.build(**{**ok, "user_ids": np.array([0, 400])})
    batch = builder.build(**ok)
    with pytest.raises(ValueError, match="feature 'item': id 3 is out of range for table 'item' of 3 rows"):
        validate_kjt(batch.features, {"user": 400, "item": 3, "category": 8})


def test_corrupt_split_file_names_file_column_and_value(tiny_data, tmp_path):
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.dataset import load_dataset

    copy = tmp_path / "ds"
    shutil.copytree(tiny_data.dir, copy)
    table = pq.read_table(copy / "valid.parquet")
    items = table.column("item_id").to_numpy().copy()
    items[5] = 999
    pq.write_table(table.set_column(1, "item_id", pa.array(items)), copy / "valid.parquet")
    with pytest.raises(ValueError, match=r"valid.parquet: column 'item_id' has id 999 outside \[0, 300\)"):
        load_dataset(copy)


def test_prefetched_epoch_equals_the_unprefetched_one_and_raises_where_it_failed(tiny_data):
    kwargs = dict(history_length=3, global_batch_size=64, num_negatives=5, seed=3)
    direct = TrainBatches(tiny_data, prefetch=0, **kwargs)
    ahead = TrainBatches(tiny_data, prefetch=2, **kwargs)
    got, expected = list(ahead.epoch(1, start_batch=2)), list(direct.epoch(1, start_batch=2))
    assert len(got) == len(expected) == len(direct) - 2
    for a, b in zip(got, expected):
        assert torch.equal(a.features.values(), b.features.values())
        assert torch.equal(a.features.lengths(), b.features.lengths())
        assert a.features.keys() == b.features.keys() and torch.equal(a.candidate_item_ids, b.candidate_item_ids)
    calls = []
    real_batch = ahead.batch_of_plan

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("bad batch")
        return real_batch(*args, **kwargs)

    ahead.batch_of_plan = failing
    it = ahead.epoch(0)
    next(it), next(it)
    with pytest.raises(ValueError, match="bad batch"):
        next(it)


def test_heldout_users_are_never_training_examples(tiny_data):
    """strong_generalization: held-out users' train rows are fold-in history, not examples."""
    heldout = np.arange(0, 400, 4)
    data = dataclasses.replace(tiny_data, heldout_users=heldout)
    batches = TrainBatches(data, history_length=2, global_batch_size=500, num_negatives=0, seed=1, prefetch=0)
    users = np.concatenate([b.features["user"].values().numpy() for b in batches.epoch(0)])
    train_users = tiny_data.splits["train"].user_ids
    assert not np.isin(users, heldout).any()
    assert len(users) == int((~np.isin(train_users, heldout)).sum())  # every other row exactly once


@pytest.mark.parametrize("world_size", [2, 3])
def test_per_rank_user_shards_partition_the_epoch_with_full_histories(tiny_data, world_size):
    """data.shard_by_user: each rank reads its users' rows only; together the ranks see every example
    exactly once per epoch, in equally many batches, with the same histories as from the whole split."""
    from recsys.data.dataset import SPLITS, load_dataset, user_boundaries

    bounds = user_boundaries(tiny_data.dir / "train.parquet", world_size, tiny_data.num_users)
    shards = [load_dataset(tiny_data.dir, (bounds[r], bounds[r + 1])) for r in range(world_size)]
    for split in SPLITS:  # the shards partition every split
        pairs = np.concatenate([s.splits[split].user_ids * 1_000_000 + s.splits[split].item_ids for s in shards])
        full = tiny_data.splits[split]
        assert np.array_equal(np.sort(pairs), np.sort(full.user_ids * 1_000_000 + full.item_ids))
    counts = [len(s.splits["train"]) for s in shards]
    assert max(counts) - min(counts) < 0.1 * sum(counts) / world_size  # balanced by rows
    kwargs = dict(history_length=3, global_batch_size=301, num_negatives=4, seed=1, world_size=world_size, prefetch=0)
    ranks = [TrainBatches(s, rank=r, rank_example_counts=counts, **kwargs) for r, s in enumerate(shards)]
    whole = TrainBatches(tiny_data, **{**kwargs, "world_size": 1})
    row_of = {
        (u, i): j
        for j, (u, i) in enumerate(zip(tiny_data.splits["train"].user_ids, tiny_data.splits["train"].item_ids))
    }
    assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) == -(-sum(counts) // 301)
    seen = []
    for parts in zip(*(r.epoch(1) for r in ranks)):
        sizes = parts[0].rank_sizes
        assert [p.num_queries for p in parts] == list(sizes)
        assert all(p.rank_sizes == sizes and p.global_num_queries == sum(sizes) for p in parts)
        for r, p in enumerate(parts):
            n = p.num_queries
            assert torch.equal(
                p.candidate_item_ids[n:], parts[0].candidate_item_ids[parts[0].num_queries :]
            )  # shared negatives
            users = p.features["user"].values().numpy()
            items = p.candidate_item_ids[:n].numpy()
            assert ((users >= bounds[r]) & (users < bounds[r + 1])).all()
            seen.append(users * 1_000_000 + items)
            # the same examples built from the whole split: identical features, histories included
            full_rows = np.array([row_of[(u, i)] for u, i in zip(users, items)])
            expected = whole.batch(full_rows, p.candidate_item_ids[n:].numpy())
            for key in ("user", "item", "category"):
                assert torch.equal(p.features[key].lengths(), expected.features[key].lengths()), key
                assert torch.equal(p.features[key].values(), expected.features[key].values()), key
    seen = np.sort(np.concatenate(seen))
    train = tiny_data.splits["train"]
    assert np.array_equal(seen, np.sort(train.user_ids * 1_000_000 + train.item_ids))


def test_per_rank_shards_too_small_for_the_epoch_are_refused(tiny_data):
    n = len(tiny_data.splits["train"])
    with pytest.raises(ValueError, match=r"rank 1 holds 3 training examples, fewer than the \d+ batches"):
        TrainBatches(
            tiny_data,
            history_length=0,
            global_batch_size=100,
            num_negatives=0,
            seed=0,
            rank=0,
            world_size=2,
            rank_example_counts=[n, 3],
        )
