"""Pretrained tables: loaded into the sharded table, frozen rows never move, bad files are clear errors."""

import logging
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.distributed.pretrained import open_pretrained
from recsys.job.run import fit
from recsys.rundir.checkpoint import latest_checkpoint
from tests.helpers.checkpoints import full_state
from tests.helpers.config import tiny_config

ITEM_ROWS, ITEM_DIM = 300, 16  # the tiny experiment's item table


@pytest.fixture(scope="module")
def item_vectors(tmp_path_factory):
    vectors = np.random.default_rng(0).normal(0, 0.1, (ITEM_ROWS, ITEM_DIM)).astype(np.float32)
    path = tmp_path_factory.mktemp("pretrained") / "items.npy"
    np.save(path, vectors)
    return path, vectors


@pytest.mark.parametrize("frozen", [True, False])
def test_pretrained_item_table_frozen_or_trainable(tmp_path, data_root, process_group, item_vectors, frozen, caplog):
    path, vectors = item_vectors
    cfg = tiny_config(
        [
            f"data.root={data_root}",
            "trainer.epochs=1",
            "trainer.max_steps_per_epoch=8",
            f"model.tables.item.pretrained_path={path}",
            f"model.tables.item.frozen={str(frozen).lower()}",
            "model.query_user_id=true",
        ]
    )  # a user table beside the pretrained one
    caplog.set_level(logging.INFO, logger="recsys")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(cfg, tmp_path)
    # the memory-mapped file's rows are copied: torch.from_numpy no longer warns about a read-only array
    assert not [w for w in caught if "not writable" in str(w.message)]
    assert f"table item: 300 x 16 loaded from {path}, {'frozen' if frozen else 'trainable'}" in caplog.text
    final = full_state(latest_checkpoint(tmp_path / "checkpoints"), tmp_path)["model"]
    items = final["model.ebc.embedding_bags.item.weight"].numpy()
    users = final["model.ebc.embedding_bags.user.weight"].numpy()
    if frozen:
        assert np.array_equal(items, vectors)
    else:
        moved = np.abs(items - vectors).max(axis=1) > 0
        assert moved.sum() > 100 and np.abs(items - vectors).max() < 1.0  # trained from the file, not from scratch
    assert np.abs(users).max() <= 400**-0.5 + 0.5  # the other tables trained normally


def test_wrong_shape_npy_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.npy"
    np.save(path, np.zeros((10, 4), dtype=np.float32))
    with pytest.raises(
        ValueError, match=r"model.tables.item.pretrained_path=.*bad.npy.*shape \(10, 4\), expected \(300, 16\)"
    ):
        open_pretrained(path, table="item", num_rows=300, dim=16)


def _parquet(path, ids, dim=4):
    pq.write_table(
        pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "vector": pa.array([[float(i)] * dim for i in ids], pa.list_(pa.float32())),
            }
        ),
        path,
    )
    return path


def test_parquet_id_set_is_checked(tmp_path):
    read = open_pretrained(_parquet(tmp_path / "ok.parquet", [2, 0, 1]), table="category", num_rows=3, dim=4)
    assert read(0, 3)[:, 0].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"1 of 3 ids missing, e.g. id 1"):
        open_pretrained(_parquet(tmp_path / "missing.parquet", [2, 0]), table="category", num_rows=3, dim=4)
    with pytest.raises(ValueError, match=r"id 0 appears 2 times"):
        open_pretrained(_parquet(tmp_path / "dup.parquet", [0, 0, 1, 2]), table="category", num_rows=3, dim=4)
    with pytest.raises(ValueError, match=r"id 7 outside table 'category' of 3 rows"):
        open_pretrained(_parquet(tmp_path / "range.parquet", [0, 1, 2, 7]), table="category", num_rows=3, dim=4)
    with pytest.raises(ValueError, match=r"vector of length 4, expected 8"):
        open_pretrained(_parquet(tmp_path / "ok.parquet", [2, 0, 1]), table="category", num_rows=3, dim=8)


def test_non_finite_vectors_are_refused_with_their_row(tmp_path):
    """A NaN row used to train silently to a NaN loss and a recall of 0."""
    values = np.zeros((300, 16), dtype=np.float32)
    values[7, 3] = np.nan
    np.save(tmp_path / "nan.npy", values)
    read = open_pretrained(tmp_path / "nan.npy", table="item", num_rows=300, dim=16)
    assert read(0, 7).shape == (7, 16)  # each rank checks the rows it reads (memory-mapped)
    with pytest.raises(ValueError, match=r"nan\.npy.*row 7, column 3 is nan; vectors must be finite"):
        read(0, 300)
    path = tmp_path / "inf.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "vector": [[0.0] * 4, [0.0, float("inf"), 0.0, 0.0], [0.0] * 4]}), path)
    with pytest.raises(ValueError, match=r"row 1, column 1 is inf"):
        open_pretrained(path, table="category", num_rows=3, dim=4)
