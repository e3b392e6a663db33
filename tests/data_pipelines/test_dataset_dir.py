"""write_dataset_dir: validation, atomic replace, deterministic bytes; read_meta / is_complete."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipelines.dataset_dir import CODE_VERSION, PARQUET_FILES, is_complete, read_meta
from data_pipelines.dataset_writer import write_dataset_dir

NUM_USERS, NUM_ITEMS, NUM_CATEGORIES = 4, 6, 3


def _interactions(rows):
    df = pd.DataFrame(rows, columns=["user_id", "item_id", "timestamp", "rating"])
    return df.astype({"user_id": "int64", "item_id": "int64", "timestamp": "int64", "rating": "float32"})


def _inputs(**overrides):
    kw = dict(
        # deliberately unsorted: the writer sorts by (user_id, timestamp, item_id)
        train=_interactions([(1, 2, 50, 4.0), (0, 1, 10, 5.0), (0, 0, 10, 3.0), (3, 5, 7, 1.0), (2, 4, 1, 2.0)]),
        valid=_interactions([(0, 3, 20, 4.0), (1, 0, 60, 2.0)]),
        test=_interactions([(0, 5, 30, 1.0)]),
        items=pd.DataFrame({"item_id": np.arange(NUM_ITEMS), "categories": [[0], [1, 2], [0, 2], [2], [0, 1, 2], [1]]}),
        users=pd.DataFrame({"user_id": np.arange(NUM_USERS)}),
        meta={
            "name": "hand",
            "protocol": "recbole",
            "seed": 0,
            "num_users": NUM_USERS,
            "num_items": NUM_ITEMS,
            "num_categories": NUM_CATEGORIES,
            "sources": [],
            "code_version": CODE_VERSION,
            "cache_key": "abc",
        },
    )
    kw.update(overrides)
    return kw


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_writes_the_contract(tmp_path):
    out = write_dataset_dir(tmp_path / "ds", **_inputs())
    assert out == (tmp_path / "ds").absolute() and is_complete(out)
    meta = read_meta(out)
    assert meta["counts"] == {"train": 5, "valid": 2, "test": 1} and meta["name"] == "hand"
    train = pq.read_table(out / "train.parquet")
    assert train.schema.names == ["user_id", "item_id", "timestamp", "rating"]
    assert [f.type for f in train.schema] == [pa.int64(), pa.int64(), pa.int64(), pa.float32()]
    assert train.column("user_id").to_pylist() == [0, 0, 1, 2, 3]
    assert train.column("item_id").to_pylist() == [0, 1, 2, 4, 5]  # (0,0,10) before (0,1,10): item_id breaks the tie
    items = pq.read_table(out / "items.parquet")
    assert items.schema.field("categories").type == pa.list_(pa.int64())
    assert items.column("categories").to_pylist()[4] == [0, 1, 2]
    assert pd.read_parquet(out / "users.parquet").user_id.tolist() == list(range(NUM_USERS))
    assert not [p for p in tmp_path.iterdir() if p.name != "ds"], "temporary folders left behind"


def test_same_inputs_give_identical_bytes(tmp_path):
    a = write_dataset_dir(tmp_path / "a", **_inputs())
    b = write_dataset_dir(tmp_path / "b", **_inputs())
    assert _snapshot(a) == _snapshot(b)


def test_out_of_range_item_id_names_column_and_value(tmp_path):
    bad = _interactions([(0, 1, 10, 5.0), (1, NUM_ITEMS + 3, 11, 1.0)])
    with pytest.raises(ValueError, match=rf"valid\.item_id.*{NUM_ITEMS + 3}"):
        write_dataset_dir(tmp_path / "ds", **_inputs(valid=bad))
    assert not tmp_path.joinpath("ds").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "override, pattern",
    [
        (dict(test=_interactions([])), r"test: split is empty"),
        (dict(train=_interactions([(-1, 0, 1, 1.0)])), r"train\.user_id: value -1"),
        (
            dict(train=_interactions([(0, 0, 1, 1.0)]).astype({"item_id": "float64"})),
            r"train\.item_id: expected an integer",
        ),
        (dict(items=pd.DataFrame({"item_id": [0, 1, 2, 3, 5, 4], "categories": [[0]] * 6})), r"items\.item_id.*row 4"),
        (
            dict(
                items=pd.DataFrame({"item_id": np.arange(NUM_ITEMS), "categories": [[0], [2, 1], [0], [0], [0], [0]]})
            ),
            r"item 1 has unsorted",
        ),
        (
            dict(items=pd.DataFrame({"item_id": np.arange(NUM_ITEMS), "categories": [[0], [1], [0], [7], [0], [0]]})),
            r"items\.categories: value 7",
        ),
        (
            dict(items=pd.DataFrame({"item_id": np.arange(NUM_ITEMS), "categories": [[0], [1], [], [0], [0], [0]]})),
            r"item 2 has no categories",
        ),
        (dict(users=pd.DataFrame({"user_id": np.arange(NUM_USERS - 1)})), r"users\.user_id"),
    ],
)
def test_validation_errors_are_specific(tmp_path, override, pattern):
    with pytest.raises(ValueError, match=pattern):
        write_dataset_dir(tmp_path / "ds", **_inputs(**override))


def test_meta_counts_must_match(tmp_path):
    kw = _inputs()
    kw["meta"] = {**kw["meta"], "counts": {"train": 5, "valid": 2, "test": 9}}
    with pytest.raises(ValueError, match="counts"):
        write_dataset_dir(tmp_path / "ds", **kw)


def test_failure_mid_write_leaves_existing_dir_untouched(tmp_path, monkeypatch):
    out = write_dataset_dir(tmp_path / "ds", **_inputs())
    before = _snapshot(out)
    real_write = pq.write_table
    calls = []

    def flaky_write(table, where, **kw):
        calls.append(where)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return real_write(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", flaky_write)
    changed = _inputs(test=_interactions([(3, 1, 99, 2.0)]))
    with pytest.raises(OSError, match="simulated"):
        write_dataset_dir(tmp_path / "ds", **changed)
    assert len(calls) == 3
    assert _snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["ds"], "temporary folder left behind"


def test_replaces_existing_dir_completely(tmp_path):
    out = write_dataset_dir(tmp_path / "ds", **_inputs())
    (out / "stale.txt").write_text("from an older writer")
    write_dataset_dir(tmp_path / "ds", **_inputs(test=_interactions([(3, 1, 99, 2.0)])))
    assert not (out / "stale.txt").exists()
    assert pd.read_parquet(out / "test.parquet").user_id.tolist() == [3]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_extra_tables_are_written(tmp_path):
    vocab = pd.DataFrame({"raw_id": ["a", "b"], "item_id": [0, 1]})
    out = write_dataset_dir(tmp_path / "ds", **_inputs(), extra_tables={"vocab/items.parquet": vocab})
    assert pd.read_parquet(out / "vocab" / "items.parquet").raw_id.tolist() == ["a", "b"]
    with pytest.raises(ValueError, match="relative"):
        write_dataset_dir(tmp_path / "ds2", **_inputs(), extra_tables={"../escape.parquet": vocab})


def test_read_meta_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "meta.json")):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'meta.json'} is corrupt"):
        read_meta(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="missing key"):
        read_meta(tmp_path)


def test_is_complete_needs_every_file(tmp_path):
    out = write_dataset_dir(tmp_path / "ds", **_inputs())
    assert is_complete(out)
    for name in (*PARQUET_FILES, "meta.json"):
        (out / name).rename(out / (name + ".bak"))
        assert not is_complete(out), name
        (out / (name + ".bak")).rename(out / name)
    assert not is_complete(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "damage,error,pattern",
    [
        ("truncate train.parquet", ValueError, r"train\.parquet: not a readable parquet file"),
        ("drop items.categories", ValueError, r"items\.parquet: no column 'categories'"),
        (
            "meta num_categories 'eight'",
            ValueError,
            r"meta\.json: 'num_categories' is 'eight', expected a non-negative integer",
        ),
        ("test item_id out of range", ValueError, r"test\.parquet: column 'item_id' has id 300 outside \[0, 300\)"),
        ("delete valid.parquet", FileNotFoundError, r"valid\.parquet: missing; prepare the dataset again"),
    ],
)
def test_reading_a_damaged_dataset_dir_names_the_file_and_the_fault(tmp_path, tiny_data, damage, error, pattern):
    import json
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.data.dataset import load_dataset

    root = tmp_path / "ds"
    shutil.copytree(tiny_data.dir, root)
    if damage == "truncate train.parquet":
        path = root / "train.parquet"
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "drop items.categories":
        pq.write_table(pq.read_table(root / "items.parquet").drop(["categories"]), root / "items.parquet")
    elif damage == "meta num_categories 'eight'":
        meta = json.loads((root / "meta.json").read_text())
        (root / "meta.json").write_text(json.dumps({**meta, "num_categories": "eight"}))
    elif damage == "test item_id out of range":
        table = pq.read_table(root / "test.parquet")
        items = table.column("item_id").to_numpy().copy()
        items[0] = 300
        pq.write_table(
            table.set_column(table.schema.get_field_index("item_id"), "item_id", pa.array(items)), root / "test.parquet"
        )
    else:
        (root / "valid.parquet").unlink()
    with pytest.raises(error, match=pattern):
        load_dataset(root)
