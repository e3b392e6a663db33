"""Issue 43 items 2 and 10-13: the serving API takes what it is given, exactly. A query without a user uses no user
row; inputs the bundle would misread are refused at the edge (recsys/serving/inputs.py), one ValueError naming the
argument; k beyond what is left returns only real items; a repeated history item counts once; encode_raw checks its
lengths and 64-bit ids. On short tiny runs with a user-id table (model.query_user_id=true), one indexed by the
dataset's ids, one through managed-collision tables (model.id_mapping=managed)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from recsys.export import ExportConfig, export_run
from recsys.job.run import fit
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config

SHORT = ["trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.early_stopping_patience=0"]
MANAGED = [
    "model.id_mapping=managed",
    "data.item_neighbors=0",  # managed ids with the neighbour table cannot be exported yet
    "model.managed.zch_size.user=512",
    "model.managed.zch_size.item=512",
]


def _bundle(root, data_root, overrides):
    run_dir = root / "run"
    fit(tiny_config([f"data.root={data_root}", *SHORT, "model.query_user_id=true", *overrides]), run_dir)
    return load_bundle(export_run(ExportConfig(run_dir=str(run_dir))))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, data_root, process_group):
    return _bundle(tmp_path_factory.mktemp("user_table"), data_root, [])


@pytest.fixture(scope="module")
def managed_bundle(tmp_path_factory, data_root, process_group):
    return _bundle(tmp_path_factory.mktemp("managed"), data_root, MANAGED)


def _without_user_rows(bundle):
    """The bundle with every user row zeroed: what a query that uses no user row must equal."""
    blank = copy.copy(bundle)
    blank.served = copy.deepcopy(bundle.served)
    with torch.no_grad():
        blank.served.part("two_tower").encoder.user.weight.zero_()
    return blank


@pytest.mark.parametrize("which", ["bundle", "managed_bundle"])
def test_a_query_without_a_user_uses_no_user_row(which, request):
    bundle = request.getfixturevalue(which)
    history = [3, 14, 15]
    top, scores = bundle.recommend(history, k=10)  # no user_id: no user row (was user 0's list)
    expected_top, expected_scores = _without_user_rows(bundle).recommend(history, k=10, user_id=0)
    assert np.array_equal(top, expected_top)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    assert not np.array_equal(top, bundle.recommend(history, k=10, user_id=0)[0])  # user 0 personalises
    ids, _ = bundle.recommend_batch([history, [7]], k=10)  # no user_ids: none for any query
    assert np.array_equal(ids[0], top)
    with pytest.raises(ValueError, match=r"^user_id: int -1 is not a user index .* or None \(a query without a user\)"):
        bundle.recommend(history, k=10, user_id=-1)


def test_serving_refuses_inputs_it_would_misread(bundle):
    cases = [
        (lambda: bundle.recommend([1.5, 2], k=5), r"^history: expected integers, got float 1.5"),
        (lambda: bundle.recommend([[1, 2], [3, 4]], k=5), r"^history: expected a 1-D sequence .* nested"),
        (lambda: bundle.recommend(["sku12"], k=5), r"^history: expected integers, got str 'sku12'; .*vocab/items"),
        (lambda: bundle.recommend([1, 400], k=5), r"^history: item indices must be in \[0, 300\), got 400"),
        (lambda: bundle.recommend([1, 2], k=2.5), r"^k: expected a positive integer, got float 2.5"),
        (lambda: bundle.recommend([1, 2], k="3"), r"^k: expected a positive integer, got str '3'"),
        (lambda: bundle.recommend([1, 2], k=0), r"^k: expected a positive integer, got int 0"),
        (lambda: bundle.recommend_batch([[1], [2]], 5, user_ids=[1]), r"^user_ids: 1 user ids for 2 histories"),
        (lambda: bundle.recommend_batch([[1], [2.5]], 5), r"^histories\[1\]: expected integers, got float 2.5"),
        (lambda: bundle.encode([0, 1], [1], [2]), r"^history_lengths: 1 lengths for 2 user_ids"),
        (lambda: bundle.encode([0], [2], [2]), r"^history_lengths: they sum to 2, but history_items holds 1"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    ids, scores = bundle.recommend_batch([], k=5)  # no histories: no rows, not a torch error
    assert ids.shape == scores.shape == (0, 5)


def test_k_beyond_the_catalogue_returns_only_the_servable_items(bundle):
    num_items = bundle.manifest["num_items"]  # 300
    top, scores = bundle.recommend([1, 2], k=1000)
    assert len(top) == len(set(top.tolist())) == num_items - 2 and set(top.tolist()).isdisjoint({1, 2})
    assert np.isfinite(scores).all() and (top >= 0).all()
    assert len(bundle.recommend([1, 2], k=1000, exclude_seen=False)[0]) == num_items
    ids, batch_scores = bundle.recommend_batch([[1, 2], [3]], k=1000)  # as many columns as the most left to anyone
    assert ids.shape == (2, num_items - 1)
    assert (ids[1] >= 0).all() and ids[0, -1] == -1 and batch_scores[0, -1] == -np.inf and (ids[0, :-1] >= 0).all()
    assert len(bundle.recommend(np.arange(num_items), k=5)[0]) == 0  # nothing left to recommend


def test_a_repeated_history_item_counts_once_at_its_latest_position(bundle):
    once, once_scores = bundle.recommend([1, 2], k=20, user_id=5)
    repeated, repeated_scores = bundle.recommend([1, 1, 1, 2], k=20, user_id=5)
    assert np.array_equal(once, repeated)
    np.testing.assert_allclose(once_scores, repeated_scores, rtol=1e-6)
    # the latest occurrence is the one kept: [2, 1, 2] is the history [1, 2]
    torch.testing.assert_close(bundle.encode([5], [3], [2, 1, 2]), bundle.encode([5], [2], [1, 2]))
    # the two-tower reads the latest history_length distinct items: a long run of one repeated item crowds none out
    long = list(range(10, 20))
    torch.testing.assert_close(bundle.encode([5], [13], [*long, 19, 19, 19]), bundle.encode([5], [10], long))


def test_encode_raw_refuses_mismatched_lengths_and_ids_beyond_64_bits(managed_bundle):
    bundle = managed_bundle
    with pytest.raises(ValueError, match=r"^history_lengths: 1 lengths for 2 user_raw_ids"):
        bundle.encode_raw(np.array([1, 2]), np.array([1]), np.array([5]))
    with pytest.raises(ValueError, match=r"^history_lengths: they sum to 3, but history_raw_ids holds 1"):
        bundle.encode_raw([1], [3], [5])
    with pytest.raises(ValueError, match=r"^user_raw_ids: 18446744073709551616 is beyond 64 bits"):
        bundle.encode_raw([2**64], [1], [5])
    with pytest.raises(ValueError, match=r"^history_raw_ids: expected integers, got str 'a'"):
        bundle.encode_raw([1], [1], ["a"])
    # the largest uint64 ids as Python ints are their two's-complement int64, as the pipeline reads them
    as_int = bundle.encode_raw([2**64 - 5], [1], [2**64 - 1])
    as_uint = bundle.encode_raw(np.array([2**64 - 5], np.uint64), [1], np.array([2**64 - 1], np.uint64))
    torch.testing.assert_close(as_int, as_uint)
