"""The generic interactions source: CSV / TSV / parquet logs and given splits by configuration alone.

Each docs/your-own-data.md example runs here on a small fixture; every bad input named in the
data-sources issue gets one clear error and leaves an earlier prepared dir as it was.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipelines.config import InteractionsDataConfig, SideColumnConfig
from data_pipelines.errors import DatasetError
from data_pipelines.interactions import log as interaction_log
from data_pipelines.interactions import prepare_interactions
from data_pipelines.interactions.prepare import _cache_options
from data_pipelines.readers import csv_chunks
from data_pipelines.splits import carve_valid
from recsys.data.dataset import load_dataset


def _log(num_users: int = 30, num_items: int = 40, per_user: int = 12, seed: int = 0) -> pd.DataFrame:
    """A log with string ids and ISO times: user u's items spread over the catalogue."""
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(num_users):
        for k, item in enumerate(rng.choice(num_items, per_user, replace=False)):
            rows.append((f"user-{u:03d}", f"sku{item}", f"2024-01-{1 + k:02d}T10:00:00Z", float(rng.integers(1, 6))))
    return pd.DataFrame(rows, columns=["visitor", "sku", "ts", "stars"])


def _prepare(cfg: InteractionsDataConfig, root: Path, protocol: str = "recbole", **kw) -> Path:
    return prepare_interactions(cfg, root=root, name="mine", protocol=protocol, seed=0, **kw)


def test_csv_with_string_ids_iso_times_bom_crlf_gzip(tmp_path):
    log = _log()
    text = "\ufeff" + log.to_csv(index=False).replace("\n", "\r\n")  # a UTF-8 BOM and CRLF endings: must simply work
    path = tmp_path / "clicks.csv.gz"
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    cfg = InteractionsDataConfig(
        path=str(path), user_column="visitor", item_column="sku", timestamp_column="ts", rating_column="stars"
    )
    out = _prepare(cfg, tmp_path / "data")
    data = load_dataset(out)
    meta = json.loads((out / "meta.json").read_text())
    assert (data.num_users, data.num_items, data.num_categories) == (30, log["sku"].nunique(), 0)
    assert meta["timestamps"] == "seconds" and sum(meta["counts"].values()) == len(log)
    assert {k: meta["counts"][k] for k in ("valid", "test")} == {"valid": 30, "test": 30}  # 12 -> 10/1/1 per user
    vocab = pq.read_table(out / "vocab/users.parquet").to_pandas()
    assert vocab["raw_id"].tolist() == sorted(log["visitor"].unique())  # raw ids ascending -> 0..n-1
    # ISO strings became epoch seconds
    assert data.splits["train"].timestamps.min() == int(pd.Timestamp("2024-01-01T10:00:00Z").timestamp())
    assert _prepare(cfg, tmp_path / "data") == out  # cached: same sources and options
    # min_rating keeps fewer rows and is another dataset dir
    filtered = _prepare(cfg, tmp_path / "data", min_rating=4.0)
    assert filtered != out and sum(json.loads((filtered / "meta.json").read_text())["counts"].values()) == int(
        (log["stars"] >= 4).sum()
    )


def test_parquet_folder_with_epoch_times_and_item_categories(tmp_path):
    log = _log(seed=1)
    log["user"] = log.pop("visitor").str.slice(5).astype(np.int64) * 1_000_003  # integer ids of any range
    log["item"] = log.pop("sku")
    log["time"] = pd.to_datetime(log.pop("ts")).astype("int64") // 10**9
    folder = tmp_path / "log"
    folder.mkdir()
    for i, part in enumerate(log.iloc[k : k + 120] for k in range(0, len(log), 120)):
        pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / f"part-{i}.parquet")
    items = pd.DataFrame({"item": sorted(log["item"].unique())})
    items["genres"] = ["A|B" if i % 3 == 0 else ("B" if i % 3 == 1 else "") for i in range(len(items))]
    items["brand"] = [f"brand{i % 4}" for i in range(len(items))]
    items.to_csv(tmp_path / "items.csv", index=False)
    cfg = InteractionsDataConfig(
        path=str(folder),
        user_column="user",
        item_column="item",
        timestamp_column="time",
        items_path=str(tmp_path / "items.csv"),
        items_id_column="item",
        categories_column="genres",
    )
    out = _prepare(cfg, tmp_path / "data", protocol="loo")
    data = load_dataset(out)
    assert data.num_categories == 3  # A, B and "(none)" for the items listed without one
    names = pq.read_table(out / "vocab/categories.parquet").column("name").to_pylist()
    assert names == ["(none)", "A", "B"]
    table = pq.read_table(out / "items.parquet").to_pandas()
    assert "brand" in table.columns and [list(c) for c in table["categories"][:3]] == [[1, 2], [2], [0]]
    # loo: each user's latest by time is test
    test = data.splits["test"]
    train = data.splits["train"]
    for u in range(3):
        assert test.timestamps[test.user_ids == u].min() > train.timestamps[train.user_ids == u].max()


def _adjacency(path: Path, rows: dict[int, list[int]]) -> None:
    path.write_text("".join(f"{u} {' '.join(map(str, items))}\n" for u, items in rows.items()))


def test_given_adjacency_split_carves_valid_from_train_only(tmp_path):
    rng = np.random.default_rng(3)
    train = {u: sorted(rng.choice(50, 10, replace=False).tolist()) for u in range(20)}
    test = {u: [i for i in rng.choice(50, 4, replace=False).tolist() if i not in train[u]] for u in range(20)}
    test[20] = [1, 2]  # a user with no train rows: dropped and counted
    test[0] = test[0] + [train[0][0]]  # a pair already in train: dropped and counted
    _adjacency(tmp_path / "train.txt", train)
    _adjacency(tmp_path / "test.txt", test)
    md5 = hashlib.md5((tmp_path / "train.txt").read_bytes()).hexdigest()
    cfg = InteractionsDataConfig(
        train_path=str(tmp_path / "train.txt"),
        test_path=str(tmp_path / "test.txt"),
        valid_fraction=0.2,
        md5={"train.txt": md5},
    )
    out = _prepare(cfg, tmp_path / "data", protocol="given")
    data = load_dataset(out)
    meta = json.loads((out / "meta.json").read_text())
    dropped = meta["given_split"]["dropped"]["test"]
    assert dropped["user_not_in_train"] == 2 and dropped["pair_in_train"] == 1
    assert meta["counts"]["valid"] == 20 * 2 and meta["counts"]["train"] == 20 * 8  # 20% of 10, per user
    assert meta["timestamps"] == "file_order" and data.num_categories == 0
    # the test split is exactly test.txt minus the dropped rows; valid and train come from train.txt
    raw = pq.read_table(out / "vocab/items.parquet").column("raw_id").to_numpy()
    got_test = {(int(u), int(raw[i])) for u, i in zip(data.splits["test"].user_ids, data.splits["test"].item_ids)}
    want_test = {(u, i) for u, items in test.items() if u < 20 for i in items if i not in train[u]}
    assert got_test == want_test
    carved = {
        (int(u), int(raw[i]))
        for s in ("train", "valid")
        for u, i in zip(data.splits[s].user_ids, data.splits[s].item_ids)
    }
    assert carved == {(u, i) for u, items in train.items() for i in items}
    # a different md5 is refused before anything is written
    with pytest.raises(DatasetError, match=r"train\.txt: md5 [0-9a-f]{32}, expected 0+"):
        _prepare(
            InteractionsDataConfig(train_path=cfg.train_path, test_path=cfg.test_path, md5={"train.txt": "0" * 32}),
            tmp_path / "data2",
            protocol="given",
        )
    assert not (tmp_path / "data2").exists()


def test_carve_valid_is_per_user_seeded_and_keeps_a_train_row():
    df = pd.DataFrame(
        {
            "user_id": np.repeat(np.arange(4), [1, 2, 10, 25]),
            "item_id": np.arange(38),
            "timestamp": np.arange(38),
            "rating": np.ones(38, np.float32),
        }
    )
    train, valid = carve_valid(df, fraction=0.1, seed=5)
    assert np.bincount(valid["user_id"], minlength=4).tolist() == [0, 0, 1, 3]  # round half up of 0.1 n, n - 1 at most
    assert len(train) + len(valid) == 38 and not set(train["item_id"]) & set(valid["item_id"])
    again_train, again_valid = carve_valid(df, fraction=0.1, seed=5)
    assert again_valid.equals(valid)
    assert not carve_valid(df, fraction=0.1, seed=6)[1].equals(valid)
    # latest: each user's last rows in time, whatever the seed
    _, latest = carve_valid(df.iloc[::-1], fraction=0.1, seed=5, latest=True)
    assert sorted(latest["timestamp"]) == [12, 35, 36, 37]  # user 2's last of 10, user 3's last 3 of 25
    assert carve_valid(df, fraction=0.1, seed=6, latest=True)[1].equals(latest)


def test_a_latest_carve_holds_out_each_users_last_train_lines_and_keeps_the_random_carves_dir(tmp_path):
    """data.interactions.valid_carve=latest: valid is each user's last train.txt entries (file order is the time of
    adjacency lists); the random carve's dataset dir (its cache key) is what it was before the option existed."""
    train = {u: list(range(u, u + 10)) for u in range(5)}
    _adjacency(tmp_path / "train.txt", train)
    _adjacency(tmp_path / "test.txt", {u: [(u + 10) % 14] for u in range(5)})  # items trained by another user
    paths = {"train_path": str(tmp_path / "train.txt"), "test_path": str(tmp_path / "test.txt"), "valid_fraction": 0.2}
    latest = _prepare(InteractionsDataConfig(**paths, valid_carve="latest"), tmp_path / "data", protocol="given")
    data = load_dataset(latest)
    raw = pq.read_table(latest / "vocab/items.parquet").column("raw_id").to_numpy()
    valid = data.splits["valid"]
    assert {(int(u), int(raw[i])) for u, i in zip(valid.user_ids, valid.item_ids)} == {
        (u, i) for u in range(5) for i in (u + 8, u + 9)
    }
    assert json.loads((latest / "meta.json").read_text())["given_split"]["valid_carve"] == "latest"
    random = _prepare(InteractionsDataConfig(**paths), tmp_path / "data", protocol="given")
    assert random != latest
    # the option enters the cache key only when it is not the default: earlier random carves keep their dirs
    options = _cache_options(InteractionsDataConfig(**paths), "given", 0, {}, 0)
    assert "valid_carve" not in options and "valid_carve" not in options["reader"]
    with pytest.raises(DatasetError, match=r"data.interactions.valid_carve='last': expected one of"):
        _prepare(InteractionsDataConfig(**paths, valid_carve="last"), tmp_path / "data3", protocol="given")


# ---------------------------------------------------------------- bad input


@pytest.fixture
def prepared(tmp_path):
    """A good prepared dir in tmp/data: every bad input below must leave it as it was."""
    path = tmp_path / "good.csv"
    _log().to_csv(path, index=False)
    cfg = InteractionsDataConfig(path=str(path), user_column="visitor", item_column="sku", timestamp_column="ts")
    out = _prepare(cfg, tmp_path / "data")
    return out, {p.name: p.stat().st_mtime_ns for p in out.iterdir()}


def _bad(tmp_path, name: str, text: str, **kw) -> InteractionsDataConfig:
    path = tmp_path / name
    path.write_text(text)
    return InteractionsDataConfig(path=str(path), **{"user_column": "u", "item_column": "i", **kw})


@pytest.mark.parametrize(
    "name, text, kw, pattern",
    [
        (
            "cols.csv",
            "user,item\n1,2\n",
            {},
            r"cols\.csv: no column\(s\) \['u', 'i'\] in the header \['user', 'item'\]",
        ),
        (
            "time.csv",
            "u,i,t\n1,2,2024-01-01\n1,3,yesterday\n",
            {"timestamp_column": "t"},
            r"time\.csv: row 2: field 't' = 'yesterday' is neither epoch seconds nor an ISO-8601 time",
        ),
        ("empty.csv", "", {}, r"empty\.csv: empty file"),
        ("header.csv", "u,i\n", {}, r"header\.csv: no rows"),
        (
            "mixed.csv",
            "u,i\n1,2\n1;3\n2,4\n",
            {},
            r"mixed\.csv: not readable as CSV \(line 3 has 1 field\(s\), line 1 has 2",
        ),
        ("nulls.csv", "u,i\n1,2\n,3\n", {}, r"nulls\.csv: row 2: field 'u' is empty"),
    ],
)
@pytest.mark.parametrize("chunked", [False, True])
def test_bad_logs_are_named_and_leave_prepared_dirs_intact(
    tmp_path, monkeypatch, prepared, name, text, kw, pattern, chunked
):
    out, before = prepared
    if chunked:  # parsed in chunks of about a line (readers.iter_csv_chunks): the same errors
        monkeypatch.setattr(interaction_log, "_CHUNKED_MIN_BYTES", 0)
        monkeypatch.setattr(csv_chunks, "CSV_CHUNK_BYTES", 4)
    with pytest.raises(DatasetError, match=pattern):
        _prepare(_bad(tmp_path, name, text, **kw), tmp_path / "data")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [out.name]  # no half-written dir


def test_bad_adjacency_token_and_unusable_given_test(tmp_path):
    (tmp_path / "train.txt").write_text("0 1 2 3\n1 2 x3 4\n")
    cfg = InteractionsDataConfig(train_path=str(tmp_path / "train.txt"), test_path=str(tmp_path / "train.txt"))
    with pytest.raises(DatasetError, match=r"train\.txt: line 2: item id 'x3' is not an integer"):
        _prepare(cfg, tmp_path / "data", protocol="given")
    _adjacency(tmp_path / "train.txt", {0: [1, 2, 3, 4], 1: [2, 3, 4, 5]})
    _adjacency(tmp_path / "test.txt", {7: [1], 8: [2]})  # users with no train rows
    cfg = InteractionsDataConfig(train_path=str(tmp_path / "train.txt"), test_path=str(tmp_path / "test.txt"))
    with pytest.raises(
        DatasetError, match=r"test\.txt: no test interaction is usable: of 2 rows, 2 have a user with no train rows"
    ):
        _prepare(cfg, tmp_path / "data", protocol="given")


def test_config_mistakes_are_named(tmp_path):
    with pytest.raises(DatasetError, match=r"data\.interactions\.path is not set"):
        _prepare(InteractionsDataConfig(), tmp_path)
    with pytest.raises(DatasetError, match=r"data\.protocol=given needs data\.interactions\.train_path and test_path"):
        _prepare(InteractionsDataConfig(train_path="x.csv"), tmp_path, protocol="given")
    with pytest.raises(DatasetError, match=r"nowhere\.csv: no such file or folder"):
        _prepare(InteractionsDataConfig(path=str(tmp_path / "nowhere.csv")), tmp_path)
    with pytest.raises(DatasetError, match=r"data\.min_rating=3\.0 needs ratings"):
        _prepare(InteractionsDataConfig(path="x.csv"), tmp_path, min_rating=3.0)


def test_readme_examples_compose_and_prepare(tmp_path):
    """docs/your-own-data.md's first commands, as Hydra overrides on fixture files."""
    from data_pipelines.prepare import prepare_dataset
    from tests.helpers.config import tiny_config

    log = _log()
    log.to_csv(tmp_path / "clicks.csv.gz", index=False, compression="gzip")
    cfg = tiny_config(
        [
            f"data.root={tmp_path / 'data'}",
            "data=interactions",
            f"data.interactions.path={tmp_path / 'clicks.csv.gz'}",
            "data.interactions.user_column=visitor",
            "data.interactions.item_column=sku",
            "data.interactions.timestamp_column=ts",
        ]
    )
    assert cfg.data.protocol == "recbole" and cfg.data.query_history == "profile"
    assert load_dataset(prepare_dataset(cfg.data)).num_users == 30
    _adjacency(tmp_path / "train.txt", {u: list(range(u, u + 10)) for u in range(5)})
    _adjacency(tmp_path / "test.txt", {u: [u + 10, u + 11] for u in range(5)})
    cfg = tiny_config(
        [
            f"data.root={tmp_path / 'data'}",
            "data=interactions",
            "data/protocol=given",
            f"data.interactions.train_path={tmp_path / 'train.txt'}",
            f"data.interactions.test_path={tmp_path / 'test.txt'}",
        ]
    )
    data = load_dataset(prepare_dataset(cfg.data))
    # items 14 and 15 never occur in train: those 3 test rows are dropped and counted
    assert {s: len(v) for s, v in data.splits.items()} == {"train": 45, "valid": 5, "test": 7}
    assert data.meta["given_split"]["dropped"]["test"]["item_not_in_train"] == 3


# ---------------------------------------------------------------- side files: categorical columns -> ids

# items: a string brand (one missing, one with spaces), tags joined by "|" (one empty, one repeated), a float
# price, an integer code, a title; sku39 is not listed (every column missing). users: a string country.
# _log() as CSV, string ids, recbole seed 0: the key without side files (cf7a6201bf3f9d10 before the id rule
# of issue 28 bumped interactions.PIPELINE_VERSION and added data.interactions.id_type / timestamp_unit)
KEY_WITHOUT_SIDE_FILES = "a5569fdd8f5d7074"


def write_side_files(folder: Path, log: pd.DataFrame) -> tuple[Path, Path]:
    """items.csv (item, brand, tags, price, zip, title) and users.csv (user, country) for ``_log()``'s ids."""
    skus = sorted(log["sku"].unique(), key=lambda s: int(s[3:]))[:-1]  # the last sku: not in the items file
    brands = ["acme", " zeta ", "", "beta"]
    tags = ["red|sale", "", "sale| red|red", "blue"]
    items = pd.DataFrame(
        {
            "item": skus,
            "brand": [brands[k % 4] for k in range(len(skus))],
            "tags": [tags[k % 4] for k in range(len(skus))],
            "price": [1.5 + k for k in range(len(skus))],
            "zip": [[90210, 10001, 5][k % 3] for k in range(len(skus))],
            "title": [f"Item {s}" for s in skus],
        }
    )
    users = pd.DataFrame({"user": sorted(log["visitor"].unique()), "country": ["FR", "DE", "US"] * 10})
    items.to_csv(folder / "items.csv", index=False)
    users.to_csv(folder / "users.csv", index=False)
    return folder / "items.csv", folder / "users.csv"


def side_config(tmp_path: Path, **kw) -> InteractionsDataConfig:
    log = _log()
    log.to_csv(tmp_path / "clicks.csv", index=False)
    items, users = write_side_files(tmp_path, log)
    return InteractionsDataConfig(
        **{
            "path": str(tmp_path / "clicks.csv"),
            "user_column": "visitor",
            "item_column": "sku",
            "items_path": str(items),
            "items_id_column": "item",
            "users_path": str(users),
            "users_id_column": "user",
            "items_columns": {"tags": SideColumnConfig(separator="|"), "zip": SideColumnConfig()},
            **kw,
        }
    )


def test_side_columns_become_ids_in_ascending_value_order(tmp_path):
    cfg = side_config(tmp_path)
    out = _prepare(cfg, tmp_path / "data")
    items = pq.read_table(out / "items.parquet")
    assert items.schema.field("brand").type == pa.int64() and items.schema.field("tags").type == pa.list_(pa.int64())
    title = items.schema.field("title").type
    assert items.schema.field("price").type == pa.float64() and (
        pa.types.is_string(title) or pa.types.is_large_string(title)
    )

    def vocab(what, column):
        table = pq.read_table(out / f"vocab/{what}/{column}.parquet").to_pydict()
        assert table["id"] == list(range(len(table["id"])))
        return table["value"]

    # strings stripped and sorted; "" and the unlisted sku39 share the missing id, after the values
    assert vocab("item_features", "brand") == ["acme", "beta", "zeta", None]
    assert vocab("item_features", "tags") == ["blue", "red", "sale"]  # no missing id: an empty bag instead
    assert vocab("item_features", "zip") == [5, 10001, 90210, None]  # declared: an integer code mapped too
    assert vocab("user_features", "country") == ["DE", "FR", "US"]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["item_features"] == {"brand": 4, "tags": 3, "zip": 4} and meta["user_features"] == {"country": 3}

    raw = pq.read_table(out / "vocab/items.parquet").column("raw_id").to_pylist()
    listed = pd.read_csv(cfg.items_path, keep_default_na=False).set_index("item")
    brand, tags = items.column("brand").to_pylist(), items.column("tags").to_pylist()
    for item_id, sku in enumerate(raw):
        if sku not in listed.index:  # sku39: missing everywhere
            assert brand[item_id] == 3 and tags[item_id] == [] and items.column("zip")[item_id].as_py() == 3
            continue
        want_brand = {"acme": 0, "beta": 1, "zeta": 2, "": 3}[listed.loc[sku, "brand"].strip()]
        want_tags = sorted(
            {{"blue": 0, "red": 1, "sale": 2}[t.strip()] for t in listed.loc[sku, "tags"].split("|") if t}
        )
        assert (brand[item_id], tags[item_id]) == (want_brand, want_tags), sku
    assert items.column("title").to_pylist()[0] == f"Item {raw[0]}"  # title: kept as text (the item's name)

    # the declaration is part of the cache key; the same one is cached
    assert _prepare(cfg, tmp_path / "data") == out
    other = _prepare(
        dataclasses.replace(cfg, items_columns={"brand": SideColumnConfig(categorical=False)}), tmp_path / "data"
    )
    assert other != out
    kept = pq.read_table(other / "items.parquet")
    assert pa.types.is_integer(kept.schema.field("zip").type) and kept.column("zip")[0].as_py() == 90210  # undeclared
    assert not pa.types.is_integer(kept.schema.field("brand").type)  # categorical: false
    sizes = json.loads((other / "meta.json").read_text())["item_features"]
    assert sizes == {"tags": 4}  # undeclared: "red|sale" etc. as 3 strings, + missing


def test_logs_without_side_files_keep_their_cache_keys(tmp_path):
    log = _log()
    log.to_csv(tmp_path / "clicks.csv", index=False)
    cfg = InteractionsDataConfig(path=str(tmp_path / "clicks.csv"), user_column="visitor", item_column="sku")
    # the key main gave this log before side columns were mapped (no side file: the same dataset dir)
    assert _prepare(cfg, tmp_path / "data").name == "mine-recbole-" + KEY_WITHOUT_SIDE_FILES


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (
            {"items_columns": {"brnd": SideColumnConfig()}},
            r"items\.csv: no column 'brnd' \(data\.interactions\.items_columns\.brnd\); columns are \[.*'brand'",
        ),
        (
            {"users_columns": {"country": SideColumnConfig(), "age": SideColumnConfig()}},
            r"users\.csv: no column 'age' \(data\.interactions\.users_columns\.age\)",
        ),
        (
            {"items_columns": {"zip": SideColumnConfig(separator="|")}},
            r"items\.csv: column 'zip' is int64: data\.interactions\.items_columns\.zip\.separator='\|' splits strings only",
        ),
        (
            {"items_columns": {"tags": SideColumnConfig(categorical=False, separator="|")}},
            r"items\.csv: column 'tags': data\.interactions\.items_columns\.tags has a separator but categorical: false",
        ),
        (
            {"items_columns": {"item": SideColumnConfig()}},
            r"items\.csv: column 'item' is the items id column \(data\.interactions\.items_id_column\)",
        ),
        (
            {"categories_column": "tags", "items_columns": {"tags": SideColumnConfig(separator="|")}},
            r"items\.csv: column 'tags' is data\.interactions\.categories_column",
        ),
        (
            {"users_path": "", "users_columns": {"country": SideColumnConfig()}},
            r"data\.interactions\.users_columns declares \['country'\] but data\.interactions\.users_path is not set",
        ),
    ],
)
def test_side_column_mistakes_are_named_and_leave_prepared_dirs_intact(tmp_path, prepared, kw, pattern):
    out, before = prepared
    with pytest.raises(DatasetError, match=pattern):
        _prepare(side_config(tmp_path, **kw), tmp_path / "data")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [out.name]


def test_parquet_side_file_dictionaries_lists_and_booleans_are_categorical(tmp_path):
    log = _log()
    log.to_csv(tmp_path / "clicks.csv", index=False)
    skus = sorted(log["sku"].unique())
    side = pa.table(
        {
            "item": skus,
            "brand": pa.array([["b", "a"][k % 2] for k in range(len(skus))]).dictionary_encode(),
            "tags": [[["x", "y"], ["y", "y"], [], None][k % 4] for k in range(len(skus))],  # a parquet list: a bag
            "sale": [k % 3 == 0 for k in range(len(skus))],
        }
    )
    pq.write_table(side, tmp_path / "items.parquet")
    cfg = InteractionsDataConfig(
        path=str(tmp_path / "clicks.csv"),
        user_column="visitor",
        item_column="sku",
        items_path=str(tmp_path / "items.parquet"),
        items_id_column="item",
    )
    out = _prepare(cfg, tmp_path / "data")
    assert json.loads((out / "meta.json").read_text())["item_features"] == {"brand": 2, "tags": 2, "sale": 2}
    items = pq.read_table(out / "items.parquet").to_pydict()
    raw = pq.read_table(out / "vocab/items.parquet").column("raw_id").to_pylist()
    k = [skus.index(sku) for sku in raw]  # the fixture row of each item id
    assert items["brand"] == [1 - j % 2 for j in k]  # a 0, b 1
    assert items["tags"] == [[[0, 1], [1], [], []][j % 4] for j in k]
    assert items["sale"] == [int(j % 3 == 0) for j in k]  # False 0, True 1
    assert pq.read_table(out / "vocab/item_features/sale.parquet").column("value").to_pylist() == [False, True]


def test_a_side_column_named_like_a_built_in_one_is_refused(tmp_path):
    cfg = side_config(tmp_path)
    users = pd.read_csv(cfg.users_path)
    users["user_id"] = range(len(users))  # beside the id column "user": would overwrite users.parquet's user_id
    users.to_csv(cfg.users_path, index=False)
    with pytest.raises(DatasetError, match=r"users\.csv: column 'user_id' has the name of a column .* \(user_id\)"):
        _prepare(cfg, tmp_path / "data")


def test_iso_times_with_and_without_a_utc_offset_in_one_column_are_refused_naming_a_row_of_each(tmp_path):
    """Issue 43 item 14: a naive time was read as UTC beside offset ones without a word. Mixed in one file, or
    across the chunks and files of one dataset, they are refused naming a row of each; all naive, or all with an
    offset, are read as before."""
    log = _log(num_users=20)
    log.loc[5, "ts"] = "2024-01-06T10:00:00"  # no offset, among "...Z" times
    path = tmp_path / "clicks.csv"
    log.to_csv(path, index=False)
    cfg = InteractionsDataConfig(path=str(path), user_column="visitor", item_column="sku", timestamp_column="ts")
    with pytest.raises(DatasetError) as e:
        _prepare(cfg, tmp_path / "data")
    said = str(e.value)
    assert said.startswith(
        f"{path}: field 'ts' mixes times with and without a UTC offset: row 6 = '2024-01-06T10:00:00'"
    )
    assert "row 1 = '2024-01-01T10:00:00Z' has one" in said and "\n" not in said
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())

    # across two files of a given split: the first all with offsets, the second all naive
    train, test = _log(num_users=20), _log(num_users=20, seed=1)
    test["ts"] = test["ts"].str.rstrip("Z")
    train.to_csv(tmp_path / "train.csv", index=False)
    test.to_csv(tmp_path / "test.csv", index=False)
    given = dataclasses.replace(
        cfg, path="", train_path=str(tmp_path / "train.csv"), test_path=str(tmp_path / "test.csv")
    )
    with pytest.raises(DatasetError, match=r"test.csv: field 'ts' mixes times with and without a UTC offset"):
        _prepare(given, tmp_path / "data2", protocol="given")

    # one convention throughout: read as before (naive = UTC, stated in docs/your-own-data.md)
    naive = _log(num_users=20)
    naive["ts"] = naive["ts"].str.rstrip("Z")
    naive.to_csv(path, index=False)
    out = _prepare(cfg, tmp_path / "data3")
    assert load_dataset(out).splits["train"].timestamps.min() == int(pd.Timestamp("2024-01-01T10:00:00Z").timestamp())
