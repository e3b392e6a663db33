"""The device loader (TrainBatches(device=...)): the host loader's batches to the last id, built with torch ops.

On CPU the device is the CPU itself: the same torch code that runs on a GPU, checked against the numpy loader
(the rule: the epoch's orders and negatives are drawn on the host from the same seeds, so every batch is equal).
"""

import dataclasses

import numpy as np
import pytest
import torch

from recsys.data import arrays
from recsys.data.batches import TrainBatches
from recsys.data.neighbors import with_item_neighbors
from recsys.data.raw_ids import with_raw_ids
from recsys.data.side_features import SideFeature

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def torch_on_cpu(monkeypatch):
    """The torch ops an accelerator runs, on CPU tensors (a CPU loader otherwise keeps numpy arrays)."""
    monkeypatch.setattr(arrays, "TORCH_ON_CPU", True)


def _side_features(data) -> tuple:
    """A users column (query tower), an items column on the query (pooled over the history) and candidate towers."""
    rng = np.random.default_rng(0)

    def column(name, source, tower, num_rows, num_ids, per_row):
        counts = rng.integers(0, per_row + 1, num_rows)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        ids = rng.integers(0, num_ids, int(indptr[-1])).astype(np.int64)
        return SideFeature(name, name, source, name, tower, indptr, ids, num_ids)

    return (
        column("group", "users", "query", data.num_users, 5, 1),
        column("tags", "items", "query", data.num_items, 9, 3),
        column("brand", "items", "candidate", data.num_items, 7, 2),
    )


def _batches_equal(a, b) -> None:
    assert a.num_queries == b.num_queries and a.global_num_queries == b.global_num_queries
    assert a.rank_sizes == b.rank_sizes
    assert torch.equal(a.candidate_item_ids, b.candidate_item_ids)
    assert a.features.keys() == b.features.keys()
    for key, jt in a.features.to_dict().items():
        other = b.features[key]
        assert torch.equal(jt.lengths(), other.lengths()), key
        assert torch.equal(jt.values(), other.values()), key
    assert a.features.lengths().dtype == b.features.lengths().dtype == torch.int32


CASES = {
    "recent": dict(history_length=4, num_negatives=3),
    "profile+dropout": dict(history_length=6, query_history="profile", history_dropout=0.3, num_negatives=2),
    "no-history": dict(history_length=0, num_negatives=0),
    "neighbours": dict(history_length=5, query_neighbors=True, num_negatives=1, user_id=False),
    "side-features": dict(history_length=3, query_history="profile", num_negatives=0),
    "raw-ids": dict(history_length=3, num_negatives=2),
}


def _data(tiny_data, case):
    if case == "neighbours":
        return with_item_neighbors(tiny_data, 4)
    if case == "side-features":
        return dataclasses.replace(tiny_data, side_features=_side_features(tiny_data))
    if case == "raw-ids":
        return with_raw_ids(tiny_data)
    return tiny_data


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_device_loader_gives_the_host_loaders_batches(tiny_data, case, world_size):
    data = _data(tiny_data, case)
    kwargs = dict(global_batch_size=100, seed=7, world_size=world_size, rank=world_size - 1, prefetch=0, **CASES[case])
    host = TrainBatches(data, **kwargs)
    device = TrainBatches(data, device=CPU, **kwargs)
    assert device.builder.keys == host.builder.keys
    assert isinstance(device.rows.item_ids, torch.Tensor) and isinstance(host.rows.item_ids, np.ndarray)
    for epoch in (0, 1):
        got = list(device.epoch(epoch))
        want = list(host.epoch(epoch))
        assert len(got) == len(want) == len(host)
        for a, b in zip(got, want):
            _batches_equal(a, b)
        assert all(isinstance(b.candidate_item_ids, torch.Tensor) for b in got)


def test_device_loader_resumes_mid_epoch_and_prefetches_the_same_batches(tiny_data):
    kwargs = dict(history_length=4, global_batch_size=64, num_negatives=2, seed=3)
    direct = TrainBatches(tiny_data, device=CPU, prefetch=0, **kwargs)
    ahead = TrainBatches(tiny_data, device=CPU, prefetch=2, **kwargs)
    for a, b in zip(list(direct.epoch(1, start_batch=3)), list(ahead.epoch(1, start_batch=3))):
        _batches_equal(a, b)
    host = list(TrainBatches(tiny_data, prefetch=0, **kwargs).epoch(1))[3:]
    for a, b in zip(list(direct.epoch(1, start_batch=3)), host):
        _batches_equal(a, b)


def test_device_loader_with_per_rank_data_follows_the_host(tiny_data):
    """data.shard_by_user: each rank's own rows, every rank's count known."""
    users = tiny_data.splits["train"].user_ids
    kwargs = dict(history_length=3, global_batch_size=50, num_negatives=1, seed=1, world_size=2, prefetch=0)
    host = TrainBatches(tiny_data, rank=0, rank_example_counts=[len(users), len(users)], **kwargs)
    device = TrainBatches(tiny_data, rank=0, rank_example_counts=[len(users), len(users)], device=CPU, **kwargs)
    for a, b in zip(list(device.epoch(0)), list(host.epoch(0))):
        _batches_equal(a, b)


def test_an_out_of_range_id_in_a_source_is_refused_once_before_any_batch(tiny_data):
    bad = dataclasses.replace(tiny_data, item_category_ids=tiny_data.item_category_ids.copy())
    bad.item_category_ids[5] = tiny_data.num_categories  # one past the category table
    with pytest.raises(ValueError, match=r"feature 'categories': id \d+ is out of range for table 'category'"):
        TrainBatches(bad, history_length=3, global_batch_size=50, num_negatives=0, seed=0, device=CPU)


def test_a_cpu_loader_keeps_numpy_arrays_and_checks_its_sources_once(tiny_data, monkeypatch):
    """Without the test hook a CPU loader reads the host's own arrays (numpy's kernels) and skips the per-batch
    check its sources were validated for."""
    monkeypatch.setattr(arrays, "TORCH_ON_CPU", False)
    kwargs = dict(history_length=4, global_batch_size=64, num_negatives=2, seed=3, prefetch=0)
    device = TrainBatches(tiny_data, device=CPU, **kwargs)
    assert isinstance(device.rows.item_ids, np.ndarray) and not device.builder.validate
    for a, b in zip(list(device.epoch(0)), list(TrainBatches(tiny_data, **kwargs).epoch(0))):
        _batches_equal(a, b)


def test_batches_carry_their_values_count_per_key(tiny_data):
    """Each KJT says how many values each key holds (from the parts' shapes), so torchrec never sums its lengths and
    reads them back inside a step: on a GPU that read-back would be a host sync every step."""
    batches = TrainBatches(tiny_data, history_length=4, global_batch_size=64, num_negatives=2, seed=0, device=CPU)
    kjt = next(batches.epoch(0)).features
    assert kjt._length_per_key is not None and kjt._offset_per_key is not None
    assert kjt._length_per_key == [int(kjt[k].lengths().sum()) for k in kjt.keys()]
    assert kjt.stride() == 64 + 66
