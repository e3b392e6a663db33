"""Issue 28, the data half: ids are identities and timestamps keep one unit. Every case of the issue
feeds its exact bad input and asserts the new outcome, and that a dataset dir prepared before is
left as it was (``prepared``); "extra" cases are bad inputs of the same paths beyond the issue's.

Ids: a text id becomes a number only when every id of the column, in every file, is written as one
(or ``data.interactions.id_type=int`` says so); surrounding whitespace is stripped from every id
field of logs and side files. Timestamps: one unit per dataset, told by size or declared.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipelines.config import IdType, InteractionsDataConfig, TimeUnit
from data_pipelines.errors import DatasetError
from data_pipelines.interactions import prepare_interactions
from recsys.data.dataset import load_dataset


def _prepare(cfg: InteractionsDataConfig, root: Path, protocol: str = "recbole") -> Path:
    return prepare_interactions(cfg, root=root, name="mine", protocol=protocol, seed=0)


def _cfg(path: Path, **kw) -> InteractionsDataConfig:
    return InteractionsDataConfig(path=str(path), **{"user_column": "u", "item_column": "i", **kw})


def _vocab(out: Path, what: str) -> list:
    return pq.read_table(out / "vocab" / f"{what}.parquet")["raw_id"].to_pylist()


def _rows(users, num_items: int = 6, item=str) -> list[tuple]:
    """Every user with items 0..num_items-1: enough rows per user for any split."""
    return [(u, item(i)) for u in users for i in range(num_items)]


@pytest.fixture
def prepared(tmp_path):
    """A good prepared dir in tmp/data: no bad input below may touch it."""
    path = tmp_path / "good.csv"
    pd.DataFrame(_rows([f"user{u}" for u in range(5)]), columns=["u", "i"]).to_csv(path, index=False)
    out = _prepare(_cfg(path), tmp_path / "data")
    return out, {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")}


def unchanged(prepared) -> bool:
    out, before = prepared
    return {p.relative_to(out): p.stat().st_mtime_ns for p in out.rglob("*")} == before


# --- 1: "007" and "7" -----------------------------------------------------------------------------


def test_ids_007_and_7_stay_two_users_unless_declared_integers(tmp_path, prepared):
    path = tmp_path / "log.csv"
    text = "u,i\n" + "".join(f"{u},{i}\n" for u, i in _rows(["007", "7", '"05"', "5"]))  # quoted or not
    path.write_text(text)
    out = _prepare(_cfg(path), tmp_path / "data")
    assert sorted(_vocab(out, "users")) == ["007", "05", "5", "7"]  # four users, each its text
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_users"] == 4 and meta["raw_ids"] == {"users": "string", "items": "integer"}
    # the user says the column holds numbers: 007 is 7
    merged = _prepare(_cfg(path, id_type=IdType.int), tmp_path / "data")
    assert _vocab(merged, "users") == [5, 7]
    assert _prepare(_cfg(path, id_type=IdType.string), tmp_path / "data") != merged  # another cache key
    # canonical integers everywhere: integers, ascending by value (the vocabulary is as before)
    path.write_text("u,i\n" + "".join(f"{u},{i}\n" for u, i in _rows([10, 9, -3])))
    assert _vocab(_prepare(_cfg(path), tmp_path / "data"), "users") == [-3, 9, 10]
    assert unchanged(prepared)


def test_a_parquet_folder_with_one_file_of_string_ids_keeps_0012_apart_from_12(tmp_path, prepared):
    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(pa.table({"u": pa.array([12] * 6, pa.int64()), "i": pa.array(range(6))}), folder / "a.parquet")
    pq.write_table(pa.table({"u": pa.array(["0012"] * 6), "i": pa.array(range(6))}), folder / "b.parquet")
    out = _prepare(_cfg(folder), tmp_path / "data")
    assert sorted(_vocab(out, "users")) == ["0012", "12"]
    assert len(load_dataset(out).splits["train"]) > 0
    assert unchanged(prepared)


# --- 2: " i5" is "i5" -----------------------------------------------------------------------------


def test_whitespace_around_ids_is_stripped_in_the_log_and_in_side_files(tmp_path, prepared):
    rows = _rows([f"u{u}" for u in range(10)], num_items=20, item=lambda i: f"i{i}")
    lines = [f"{u}, {i}, {k}" if k % 2 else f"{u},{i},{k}" for k, (u, i) in enumerate(rows)]  # "u1, i5, ts" on some
    path = tmp_path / "log.csv"
    path.write_text("u,i,ts\n" + "\n".join(lines) + "\n")
    items = tmp_path / "items.csv"
    items.write_text("item_id,brand\n" + "".join(f" i{i} ,b{i % 3}\n" for i in range(20)))
    out = _prepare(_cfg(path, items_path=str(items)), tmp_path / "data")
    assert sorted(_vocab(out, "items")) == sorted(f"i{i}" for i in range(20))  # 20 items, not 40
    brands = pq.read_table(out / "items.parquet")["brand"].to_pylist()
    assert len(brands) == 20 and max(brands) == 2  # every item found in the side file: no missing id (3)
    assert unchanged(prepared)


# --- 3: 64-bit ids --------------------------------------------------------------------------------


def test_uint64_ids_above_2_63_work_from_csv_and_parquet(tmp_path, prepared):
    big = [2**64 - 1000 + u for u in range(4)]  # 18446744073709550616, ...
    csv = tmp_path / "log.csv"
    pd.DataFrame(_rows([str(u) for u in big]), columns=["u", "i"]).to_csv(csv, index=False)
    parquet = tmp_path / "log.parquet"
    pq.write_table(
        pa.table({"u": pa.array([u for u, _ in _rows(big)], pa.uint64()), "i": [int(i) for _, i in _rows(big)]}),
        parquet,
    )
    for path in (csv, parquet):
        out = _prepare(_cfg(path), tmp_path / "data")
        assert _vocab(out, "users") == [str(u) for u in big]  # their decimal text: every id kept apart
    # declared integers: a clear error naming the file, the column and the value
    for path, row in ((csv, 1), (parquet, 1)):
        with pytest.raises(
            DatasetError, match=rf"{path.name}: row {row}: field 'u' = '?18446744073709550616'? does not fit int64"
        ):
            _prepare(_cfg(path, id_type=IdType.int), tmp_path / "data")
    assert unchanged(prepared)


# --- 4: milliseconds on most rows, seconds on the newest -----------------------------------------


def _ms_log(newest_in_seconds: bool) -> pd.DataFrame:
    rows = []
    for u in range(300):
        for k in range(5):
            rows.append((u, k, 1_700_000_000_000 + 1000 * (u + k)))  # ms
        newest = 1_700_000_500 + u if newest_in_seconds else 1_700_000_500_000 + 1000 * u
        rows.append((u, 5 + u % 7, newest))  # the user's true newest item
    return pd.DataFrame(rows, columns=["u", "i", "ts"])


def test_timestamps_mixing_ms_and_seconds_are_refused_naming_rows(tmp_path, prepared):
    path = tmp_path / "log.csv"
    _ms_log(newest_in_seconds=True).to_csv(path, index=False)
    with pytest.raises(
        DatasetError,
        match=r"log\.csv: field 'ts' mixes time units: row 6 = 1700000500 reads as epoch seconds, but row 1 = "
        r"1700000000000 reads as epoch milliseconds .* set data\.interactions\.timestamp_unit",
    ):
        _prepare(_cfg(path, timestamp_column="ts"), tmp_path / "data", protocol="loo")
    assert unchanged(prepared)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [prepared[0].name]  # nothing half written


def test_timestamps_in_one_unit_keep_it_and_meta_json_names_it(tmp_path):
    path = tmp_path / "log.csv"
    _ms_log(newest_in_seconds=False).to_csv(path, index=False)
    out = _prepare(_cfg(path, timestamp_column="ts"), tmp_path / "data", protocol="loo")
    assert json.loads((out / "meta.json").read_text())["timestamps"] == "milliseconds"
    test = pq.read_table(out / "test.parquet").to_pandas()
    items = np.array(_vocab(out, "items"))
    assert len(test) == 300 and (items[test["item_id"]] == 5 + test["user_id"].to_numpy() % 7).all()  # the true newest
    # declared: taken as it is, whatever the size
    out = _prepare(_cfg(path, timestamp_column="ts", timestamp_unit=TimeUnit.us), tmp_path / "data", protocol="loo")
    assert json.loads((out / "meta.json").read_text())["timestamps"] == "microseconds"


# --- 5: a parquet folder whose files disagree -----------------------------------------------------


def test_a_parquet_folder_whose_files_disagree_is_read_file_by_file_or_named(tmp_path, prepared):
    folder = tmp_path / "events"
    folder.mkdir()
    ts = [1_700_000_000 + k for k in range(6)]
    pq.write_table(pa.table({"u": [1] * 6, "i": list(range(6)), "ts": ts}), folder / "part-0.parquet")
    # non-numeric string ids in the second file: read as text, not "damaged"
    pq.write_table(pa.table({"u": ["guest"] * 6, "i": [str(i) for i in range(6)], "ts": ts}), folder / "part-1.parquet")
    out = _prepare(_cfg(folder, timestamp_column="ts"), tmp_path / "data")
    assert sorted(_vocab(out, "users")) == ["1", "guest"]
    assert _vocab(out, "items") == list(range(6))  # "3" written as a canonical integer is the item 3 of part-0
    # the third file calls its time column another name: missing, in that file
    third = folder / "part-2.parquet"
    pq.write_table(pa.table({"u": [2] * 6, "i": list(range(6)), "time": ts}), third)
    with pytest.raises(DatasetError, match=rf"events: column 'ts' is missing in {third}; its columns are"):
        _prepare(_cfg(folder, timestamp_column="ts"), tmp_path / "data")
    assert unchanged(prepared)


# --- 10: a .txt CSV with a header ----------------------------------------------------------------


def test_a_txt_csv_with_a_header_is_read_as_csv_else_the_error_names_the_format(tmp_path, prepared):
    path = tmp_path / "clicks.txt"
    path.write_text("user,item,ts\n" + "".join(f"u{u},i{i},{100 + int(i)}\n" for u, i in _rows(range(5))))
    cfg = InteractionsDataConfig(path=str(path), user_column="user", item_column="item", timestamp_column="ts")
    out = _prepare(cfg, tmp_path / "data", protocol="loo")
    assert json.loads((out / "meta.json").read_text())["num_users"] == 5
    # a header that names other columns: taken as adjacency lists, and the error says how to say CSV
    bad = InteractionsDataConfig(path=str(path), user_column="visitor", item_column="item", timestamp_column="ts")
    with pytest.raises(
        DatasetError, match=r"clicks\.txt: read as adjacency lists .* set data\.interactions\.format=csv"
    ):
        _prepare(bad, tmp_path / "data")
    bad = InteractionsDataConfig(path=str(path), user_column="visitor", item_column="item")
    with pytest.raises(
        DatasetError,
        match=r"clicks\.txt: line 1: user id 'user,item,ts' is not an integer; .*data\.interactions\.format",
    ):
        _prepare(bad, tmp_path / "data")
    assert unchanged(prepared)


# --- 17: "5 stars"; a given split typed differently across its files -----------------------------


def test_a_rating_that_is_not_a_number_names_its_row(tmp_path, prepared):
    path = tmp_path / "log.csv"
    path.write_text("u,i,r\n" + "".join(f"{u},{i},4\n" for u, i in _rows(range(3))) + "2,9,5 stars\n")
    with pytest.raises(DatasetError, match=r"log\.csv: row 19: field 'r' = '5 stars' is not a number"):
        _prepare(_cfg(path, rating_column="r"), tmp_path / "data")
    assert unchanged(prepared)


def test_a_given_split_typed_differently_across_files_keeps_one_id_per_user(tmp_path, prepared):
    users = ["00279", "00280", "00281"]
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    rows = [(u, i) for k, u in enumerate(users) for i in range(8) if i != k]  # user k's test item: k
    pd.DataFrame(rows, columns=["u", "i"]).to_csv(train, index=False)
    # the test file holds a "guest": its ids are strings; the train file's alone look like integers
    pd.DataFrame([(u, k) for k, u in enumerate(users)] + [("guest", 1)], columns=["u", "i"]).to_csv(test, index=False)
    cfg = InteractionsDataConfig(train_path=str(train), test_path=str(test), user_column="u", item_column="i")
    out = _prepare(cfg, tmp_path / "data", protocol="given")
    dropped = json.loads((out / "meta.json").read_text())["given_split"]["dropped"]["test"]
    assert dropped["user_not_in_train"] == 1  # the guest only: 00279 is the same user in both files
    assert sorted(_vocab(out, "users")) == users
    assert unchanged(prepared)


# --- 7, 14: data.root a file; a full disk ----------------------------------------------------------


def test_data_root_that_is_a_file_is_one_clear_error(tmp_path):
    from data_pipelines.prepare import prepare_dataset
    from tests.helpers.config import tiny_config

    (tmp_path / "root").write_text("not a folder")
    for root in (tmp_path / "root", tmp_path / "root" / "sub"):
        with pytest.raises(DatasetError, match=rf"data\.root={root}: (is|is inside .*, which is) a file, not a folder"):
            prepare_dataset(tiny_config([f"data.root={root}"]).data)
    assert (tmp_path / "root").read_text() == "not a folder"


def test_a_full_disk_during_prepare_is_one_line_naming_the_path(tmp_path, prepared, monkeypatch):
    import data_pipelines.dataset_writer as dataset_writer
    from data_pipelines.prepare import prepare_dataset
    from tests.helpers.config import tiny_config

    def full_disk(table, where, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(where))

    monkeypatch.setattr(dataset_writer.pq, "write_table", full_disk)
    log = tmp_path / "other.csv"
    pd.DataFrame(_rows(range(5)), columns=["u", "i"]).to_csv(log, index=False)
    cfg = tiny_config(
        [
            f"data.root={tmp_path / 'data'}",
            "data=interactions",
            f"data.interactions.path={log}",
            "data.interactions.user_column=u",
            "data.interactions.item_column=i",
        ]
    ).data
    with pytest.raises(DatasetError, match=r"\.parquet: no space left on device while preparing the dataset") as e:
        prepare_dataset(cfg)
    assert "\n" not in str(e.value) and f"data.root={tmp_path / 'data'}" in str(e.value)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [prepared[0].name]  # nothing left behind
    assert unchanged(prepared)


# --- extra: ISO-8601 times minutes apart (found on the way: pandas 3 parses to microseconds, and the
# seconds were taken as ns // 1e9, i.e. kiloseconds: times within ~17 minutes were one time) ------------


def test_iso_times_minutes_apart_stay_apart_and_are_epoch_seconds(tmp_path):
    rows = [(u, f"i{k}", f"2024-01-01T09:{10 * k:02d}:00Z") for u in range(3) for k in range(1, 5)]
    rows += [(u, "i0", "2024-01-01T10:10:00Z") for u in range(3)]  # each user's newest: the smallest item id
    rows += [(u, "i9", "2024-01-01T10:00:00Z") for u in range(3)]  # ten minutes before it
    path = tmp_path / "log.csv"
    pd.DataFrame(rows, columns=["u", "i", "ts"]).to_csv(path, index=False)
    out = _prepare(_cfg(path, timestamp_column="ts"), tmp_path / "data", protocol="loo")
    test = pq.read_table(out / "test.parquet").to_pandas()
    assert [_vocab(out, "items")[i] for i in test["item_id"]] == ["i0"] * 3
    assert test["timestamp"].tolist() == [int(pd.Timestamp("2024-01-01T10:10:00Z").timestamp())] * 3


# --- extra: ten more bad inputs on the id and time paths -------------------------------------------


def _parquet(path: Path, **columns) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


EXTRA = {
    # 1. declared integers, and one id is a word
    "id_type_int_word": (
        lambda d: _text(d / "a.csv", "u,i\n1,2\nbob,3\n"),
        {"id_type": IdType.int},
        r"a\.csv: row 2: field 'u' = 'bob' is not an integer \(data\.interactions\.id_type=int\)",
    ),
    # 2. declared integers, and one is past int64
    "id_type_int_overflow": (
        lambda d: _text(d / "a.csv", "u,i\n1,2\n99999999999999999999,3\n"),
        {"id_type": IdType.int},
        r"a\.csv: row 2: field 'u' = '99999999999999999999' does not fit int64",
    ),
    # 3. an id of spaces only
    "blank_id": (lambda d: _text(d / "a.csv", "u,i\n1,2\n   ,3\n"), {}, r"a\.csv: row 2: field 'u' is empty"),
    # 4. float ids in one file of a parquet folder: that file named
    "float_ids_in_one_file": (
        lambda d: _folder(d, [{"u": [1, 2], "i": [1, 2]}, {"u": [1.0, 2.5], "i": [1, 2]}]),
        {},
        r"part-1\.parquet: field 'u' holds decimals \(double\)",
    ),
    # 5. binary ids
    "binary_ids": (
        lambda d: _parquet(d / "a.parquet", u=pa.array([b"\x00\x01"], pa.binary()), i=[1]),
        {},
        r"a\.parquet: field 'u' has type binary; ids must be integers or strings",
    ),
    # 6. a side file listing one id twice, apart only by spaces
    "side_id_twice": (
        lambda d: _text(d / "a.csv", "u,i\n" + "".join(f"{u},{i}\n" for u, i in _rows(range(3)))),
        {"items_path": "items.csv"},
        r"items\.csv: items id 1 appears twice",
    ),
    # 7. a parquet folder with seconds in one file and milliseconds in the next: both files named
    "units_across_files": (
        lambda d: _folder(
            d,
            [
                {"u": [1, 1], "i": [1, 2], "t": [1_700_000_000] * 2},
                {"u": [2, 2], "i": [1, 2], "t": [1_700_000_000_000] * 2},
            ],
        ),
        {"timestamp_column": "t"},
        r"part-1\.parquet: field 't' mixes time units: row 1 = 1700000000000 reads as epoch milliseconds, but "
        r".*part-0\.parquet: row 1 = 1700000000 reads as epoch seconds",
    ),
    # 8. a zero standing for a missing time in a column of milliseconds
    "zero_time": (
        lambda d: _text(d / "a.csv", "u,i,t\n1,2,1700000000000\n1,3,0\n"),
        {"timestamp_column": "t"},
        r"a\.csv: field 't' mixes time units: row 2 = 0 reads as epoch seconds, but row 1 = 1700000000000",
    ),
    # 9. an adjacency file with a header line
    "adjacency_header": (
        lambda d: _text(d / "a.txt", "user item\n1 2 3\n"),
        {"user_column": "user_id"},
        r"a\.txt: line 1: user id 'user' is not an integer; .* set data\.interactions\.format=csv or tsv",
    ),
    # 10. a rating written as a word
    "blank_rating": (
        lambda d: _text(d / "a.csv", "u,i,r\n1,2,4\n1,3,four\n"),
        {"rating_column": "r"},
        r"a\.csv: row 2: field 'r' = 'four' is not a number",
    ),
}


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _folder(root: Path, parts: list[dict]) -> Path:
    folder = root / "events"
    folder.mkdir()
    for k, columns in enumerate(parts):
        _parquet(folder / f"part-{k}.parquet", **columns)
    return folder


@pytest.mark.parametrize("case", sorted(EXTRA))
def test_more_bad_ids_and_times_are_named(tmp_path, prepared, case):
    make, kw, pattern = EXTRA[case]
    path = make(tmp_path)
    if "items_path" in kw:
        (tmp_path / "items.csv").write_text("item_id,brand\n1,a\n 1 ,b\n")
        kw = {**kw, "items_path": str(tmp_path / "items.csv")}
    with pytest.raises(DatasetError, match=pattern):
        _prepare(_cfg(path, **kw), tmp_path / "data")
    assert unchanged(prepared)
