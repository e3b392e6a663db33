"""Which items a training query sees: the protocol's default, and the profile bag's guarantees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.data.batches import TrainBatches
from tests.helpers.config import tiny_config


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "profile"),  # the synthetic default is a recbole (random) split
        (["data=movielens_1m"], "profile"),
        (["data=movielens_1m", "data/protocol=loo"], "recent"),
        (["data=movielens_1m", "data/protocol=strong_generalization"], "profile"),
        (["data=gowalla"], "profile"),
        (["data=interactions", "data.interactions.path=x.csv", "data/protocol=loo"], "recent"),
    ],
)
def test_the_protocol_sets_the_query_history(overrides, expected):
    assert tiny_config(overrides).data.query_history == expected


def _bags(batches: TrainBatches, epoch: int):
    """{row: bag items} for every example of an epoch (prefetch off: batches are built here)."""
    order = batches.profile_order(epoch)
    rows = batches.example_rows
    lengths, items = batches.profile_bags(rows, order)
    splits = np.split(items, np.cumsum(lengths)[:-1])
    return dict(zip(rows.tolist(), (s.tolist() for s in splits)))


def test_profile_bag_is_other_training_items_never_the_target(tiny_data):
    history_length = 6
    batches = TrainBatches(
        tiny_data,
        history_length=history_length,
        global_batch_size=64,
        num_negatives=0,
        seed=0,
        query_history="profile",
        prefetch=0,
    )
    train = tiny_data.splits["train"]
    bags0, bags1 = _bags(batches, 0), _bags(batches, 1)
    changed = 0
    for row, bag in bags0.items():
        u = train.user_ids[row]
        others = np.flatnonzero(train.user_ids == u)
        others = others[others != row]
        # distinct rows of the same user, never the target's own row, as many as the cap allows
        assert len(bag) == min(history_length, len(others))
        assert train.item_ids[row] not in bag
        assert set(bag) <= set(train.item_ids[others].tolist()) and len(set(bag)) == len(bag)
        changed += bag != bags1[row]
    assert changed > 0.5 * len(bags0)  # a fresh subset each epoch (acts as dropout)
    # what the batches carry is that bag
    batch = next(batches.epoch(0))
    features = batch.features.to_dict()
    hist = features["item"]
    rows = batches.example_rows[np.random.default_rng([0, 0]).permutation(len(batches.example_rows))[:64]]
    for j, row in enumerate(rows):
        assert hist.values()[hist.offsets()[j] : hist.offsets()[j + 1]].tolist() == bags0[int(row)]
    cats = features["category"]  # the bag items' categories follow them
    first = bags0[int(rows[0])]
    expected = [
        c
        for i in first
        for c in tiny_data.item_category_ids[tiny_data.item_category_indptr[i] : tiny_data.item_category_indptr[i + 1]]
    ]
    assert cats.values()[cats.offsets()[0] : cats.offsets()[1]].tolist() == expected


@pytest.mark.parametrize(
    "overrides, tables",
    [
        ([], {"item", "category", "neighbor"}),  # profile bag: no user-id table at all
        (["data.query_history=recent"], {"user", "item", "category", "neighbor"}),
        (["model.query_user_id=true"], {"user", "item", "category", "neighbor"}),
        (["data.history_length=0"], {"user", "item", "category", "neighbor"}),  # nothing but the user id to go on
    ],
)
def test_the_user_id_table_exists_only_where_the_query_uses_it(tiny_data, overrides, tables):
    from tests.helpers.run_task import run_task

    task = run_task(tiny_config(overrides), tiny_data)
    assert {c.name for c in task.model.ebc.embedding_bag_configs()} == tables


def test_a_query_with_nothing_to_see_is_refused(tiny_data):
    from tests.helpers.run_task import run_task

    with pytest.raises(ValueError, match=r"model.query_user_id=false needs a history"):
        run_task(tiny_config(["model.query_user_id=false", "data.history_length=0"]), tiny_data)


@pytest.mark.parametrize("dropout", [0.0, 0.25])
def test_profile_bags_and_their_categories_equal_the_per_item_gathers(tiny_data, dropout):
    """The epoch's profile order hands each bag out as at most two ranges of its arrays: the items are the
    rows following the target's in its user's shuffled block, wrapping around (the per-row reference below),
    and the categories of those items, in bag order, as the item -> categories CSR gives them."""
    from recsys.data.ragged import gather_rows, segment_sum

    batches = TrainBatches(
        tiny_data, history_length=7, global_batch_size=64, num_negatives=0, seed=2,
        query_history="profile", history_dropout=dropout, prefetch=0,
    )  # fmt: skip
    train, order = tiny_data.splits["train"], batches.profile_order(1)
    rows = batches.example_rows
    lengths, items = batches.profile_bags(rows, order)
    expected = []
    for row, n in zip(rows, lengths):
        s, e = batches.user_start[row], batches.user_end[row]
        p = order.position[row]
        expected += [train.item_ids[order.shuffled[s + (p - s + k) % (e - s)]] for k in range(1, n + 1)]
    assert np.array_equal(items, expected) and lengths.sum() > 0 and (lengths < 7).any()
    cat_lengths, cats = batches.profile_categories(rows, order)
    per_item, want = gather_rows(tiny_data.item_category_indptr, tiny_data.item_category_ids, items)
    assert np.array_equal(cats, want) and np.array_equal(cat_lengths, segment_sum(per_item, lengths))
    batch = batches.batch(rows[:64], np.zeros(0, dtype=np.int64), profile_order=order)
    category = batch.features["category"]
    assert torch.equal(
        category.values()[: int(cat_lengths[:64].sum())], torch.from_numpy(cats[: int(cat_lengths[:64].sum())])
    )
