"""The generic source's bounded-memory pipeline (data_pipelines/bucketed.py).

A tiny ``memory_budget_mb`` forces the out-of-core path (the log spilled to disk, users in several
buckets); the dataset it writes must be the one the in-memory split functions give on the whole log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipelines import bucketed, readers
from data_pipelines.config import InteractionsDataConfig
from data_pipelines.dataset_writer import InteractionsFileWriter, write_dataset_dir
from data_pipelines.errors import DatasetError
from data_pipelines.filters import filter_interactions
from data_pipelines.interactions import log as interaction_log
from data_pipelines.interactions import prepare_interactions
from data_pipelines.readers import csv_chunks
from data_pipelines.splits import split

NUM_ROWS = 40_000  # >= 4 buckets at 1 MiB (6,553 rows each), and a log store past its 256 KiB


def _log(string_ids: bool, seed: int = 0) -> pd.DataFrame:
    """Skewed users and items, sparse raw ids, repeated (user, item) pairs and tied timestamps."""
    rng = np.random.default_rng(seed)
    users = rng.zipf(1.6, NUM_ROWS) % 3000 * 7919 + 10**9
    items = rng.zipf(1.4, NUM_ROWS) % 2000 * 104_729
    log = pd.DataFrame(
        {
            "u": users,
            "i": items,
            "t": rng.integers(0, 500, NUM_ROWS),  # few values: ties within a user
            "r": rng.integers(1, 6, NUM_ROWS).astype(np.float64),
        }
    )
    if string_ids:
        log["u"], log["i"] = "u" + log["u"].astype(str), "sku-" + log["i"].astype(str)
    return log


def _reference(log: pd.DataFrame, protocol: str, filters: dict, seed: int) -> dict[str, pd.DataFrame]:
    """The in-memory algorithm on the whole log: raw ids -> indices, filters, split, in raw ids."""
    users, items = np.sort(log["u"].unique()), np.sort(log["i"].unique())
    df = pd.DataFrame(
        {
            "user_id": np.searchsorted(users, log["u"].to_numpy()),
            "item_id": np.searchsorted(items, log["i"].to_numpy()),
            "timestamp": log["t"].to_numpy(np.int64),
            "rating": log["r"].to_numpy(np.float32),
        }
    )
    kept = filter_interactions(df, **filters)
    options = {"num_heldout_users": 50, "drop_unseen_items": True} if protocol == "strong_generalization" else {}
    parts = split(kept, protocol, seed=seed, **options)
    return {
        name: pd.DataFrame(
            {"u": users[p["user_id"]], "i": items[p["item_id"]], "t": p["timestamp"], "r": p["rating"]}
        ).reset_index(drop=True)
        for name, p in zip(("train", "valid", "test"), parts)
    }


def _written(out: Path) -> dict[str, pd.DataFrame]:
    users = pq.read_table(out / "vocab/users.parquet").column("raw_id").to_numpy(zero_copy_only=False)
    items = pq.read_table(out / "vocab/items.parquet").column("raw_id").to_numpy(zero_copy_only=False)
    frames = {}
    for name in ("train", "valid", "test"):
        t = pq.read_table(out / f"{name}.parquet").to_pandas()
        frames[name] = pd.DataFrame(
            {"u": users[t["user_id"]], "i": items[t["item_id"]], "t": t["timestamp"], "r": t["rating"]}
        )
    return frames


@pytest.mark.parametrize(
    "protocol, string_ids, filters",
    [
        ("recbole", False, {"min_rating": 2.0, "min_user_interactions": 0, "min_item_interactions": 0}),
        ("recbole", True, {"min_rating": 0.0, "min_user_interactions": 3, "min_item_interactions": 4}),
        ("loo", True, {"min_rating": 0.0, "min_user_interactions": 0, "min_item_interactions": 0}),
        ("strong_generalization", False, {"min_rating": 0.0, "min_user_interactions": 5, "min_item_interactions": 0}),
    ],
)
def test_out_of_core_writes_the_in_memory_dataset(tmp_path, monkeypatch, protocol, string_ids, filters):
    log = _log(string_ids)
    path = tmp_path / "log.csv.gz"
    log.to_csv(path, index=False, compression="gzip")
    kw = dict(name="log", protocol=protocol, seed=3, num_heldout_users=50, **filters)
    base = dict(path=str(path), user_column="u", item_column="i", timestamp_column="t", rating_column="r")
    out = {}
    # on disk (1 MiB: the log spilled, >= 4 buckets on two threads); in memory, one bucket; in memory,
    # several buckets on two threads (as a log of >= 1M rows is)
    for mode, budget, parallel_min_rows in (("disk", 1, 1 << 20), ("one", 2048, 1 << 20), ("threads", 2048, 1000)):
        monkeypatch.setattr(bucketed, "_PARALLEL_MIN_ROWS", parallel_min_rows)
        cfg = InteractionsDataConfig(**base, memory_budget_mb=budget)
        out[mode] = prepare_interactions(cfg, root=tmp_path / f"data-{mode}", **kw)
    meta = {mode: json.loads((out[mode] / "meta.json").read_text()) for mode in out}
    assert meta["disk"]["num_buckets"] >= 4 and meta["one"]["num_buckets"] == 1 and meta["threads"]["num_buckets"] > 1
    assert len({p.name for p in out.values()}) == 1  # the budget is not part of the cache key: same dataset
    want = _reference(log, protocol, filters, seed=3)
    for mode in out:
        got = _written(out[mode])
        for name in want:
            pd.testing.assert_frame_equal(got[name], want[name], check_dtype=False, obj=f"{name} ({mode})")
    # the same bytes, whatever the budget and the buckets
    for rel in ("train.parquet", "valid.parquet", "test.parquet", "vocab/users.parquet", "vocab/items.parquet"):
        assert len({(out[mode] / rel).read_bytes() for mode in out}) == 1, rel
    if protocol == "strong_generalization":
        held = [pq.read_table(out[mode] / "heldout_users.parquet").to_pandas() for mode in out]
        for other in held[1:]:
            pd.testing.assert_frame_equal(held[0], other)
        assert (held[0]["split"] == "test").sum() <= 50


def test_errors_name_the_row_across_batches_and_leave_no_work_files(tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    for k in range(3):  # one batch per file: row 250 of the log is row 50 of the third file, which is named
        users = pa.array([None if k * 100 + j == 249 else j for j in range(100)], pa.int64())
        pq.write_table(pa.table({"u": users, "i": pa.array(np.arange(100))}), folder / f"part-{k}.parquet")
    cfg = InteractionsDataConfig(path=str(folder), user_column="u", item_column="i", memory_budget_mb=1)
    with pytest.raises(DatasetError, match=r"log/part-2\.parquet: row 50: field 'u' is empty"):
        prepare_interactions(cfg, root=tmp_path / "data", name="log", protocol="recbole")
    assert list((tmp_path / "data").iterdir()) == []  # the work folder (spill files) is gone too
    with pytest.raises(DatasetError, match=r"memory_budget_mb=0: must be positive"):
        prepare_interactions(
            InteractionsDataConfig(path=str(folder), memory_budget_mb=0),
            root=tmp_path / "data",
            name="x",
            protocol="loo",
        )


def test_the_chunked_split_writer_writes_the_whole_frame_bytes(tmp_path):
    rng = np.random.default_rng(0)
    n = (1 << 20) + 12_345  # two row groups
    df = pd.DataFrame(
        {
            "user_id": np.sort(rng.integers(0, 5000, n)),
            "item_id": rng.integers(0, 900, n),
            "timestamp": rng.integers(0, 10**9, n),
            "rating": np.ones(n, np.float32),
        }
    )
    common = dict(
        items=pd.DataFrame({"item_id": np.arange(900), "categories": [np.zeros(0, np.int64)] * 900}),
        users=pd.DataFrame({"user_id": np.arange(5000)}),
        meta={
            "name": "x",
            "protocol": "recbole",
            "seed": 0,
            "num_users": 5000,
            "num_items": 900,
            "num_categories": 0,
            "sources": [],
            "code_version": "test",
            "cache_key": "k",
        },
    )
    small = df.iloc[:10].copy()
    whole = write_dataset_dir(tmp_path / "whole", train=df, valid=small, test=small, **common)
    writer = InteractionsFileWriter(tmp_path / "train.parquet", "train", 5000, 900)
    cuts = np.searchsorted(df["user_id"].to_numpy(), [0, 700, 3100, 5000])  # chunks of whole users
    for a, b in zip(cuts[:-1], cuts[1:]):
        writer.append(df.iloc[a:b].sample(frac=1.0, random_state=1))  # unsorted within: sorted by the writer
    assert writer.close() == n
    chunked = write_dataset_dir(
        tmp_path / "chunked", train=tmp_path / "train.parquet", valid=small, test=small, **common
    )
    assert (whole / "train.parquet").read_bytes() == (chunked / "train.parquet").read_bytes()
    assert json.loads((chunked / "meta.json").read_text())["counts"]["train"] == n
    writer = InteractionsFileWriter(tmp_path / "bad.parquet", "train", 5000, 900)
    writer.append(df.iloc[cuts[1] : cuts[2]])
    with pytest.raises(ValueError, match=r"train: chunks out of user order"):
        writer.append(df.iloc[cuts[0] : cuts[1]])
    writer.close()


def test_one_heavy_user_leaves_empty_buckets_and_the_same_split(tmp_path):
    """The last user holds most rows: every user falls in bucket 0 (buckets cut at users' first rows)
    and the buckets after it hold nobody; the split is still the in-memory one."""
    rng = np.random.default_rng(5)
    users = np.r_[np.repeat(np.arange(120), 25), np.full(30_000, 10**6)]
    log = pd.DataFrame(
        {"u": users, "i": rng.integers(0, 3000, len(users)), "t": rng.integers(0, 10**6, len(users)), "r": 1.0}
    )
    path = tmp_path / "log.parquet"
    pq.write_table(pa.Table.from_pandas(log, preserve_index=False), path)
    cfg = InteractionsDataConfig(
        path=str(path), user_column="u", item_column="i", timestamp_column="t", memory_budget_mb=1
    )
    filters = {"min_rating": 0.0, "min_user_interactions": 0, "min_item_interactions": 0}
    out = prepare_interactions(
        cfg,
        root=tmp_path / "data",
        name="log",
        protocol="strong_generalization",
        seed=1,
        num_heldout_users=50,
        **filters,
    )
    assert json.loads((out / "meta.json").read_text())["num_buckets"] >= 8
    want, got = _reference(log, "strong_generalization", filters, seed=1), _written(out)
    for name in want:
        pd.testing.assert_frame_equal(got[name].assign(r=1.0), want[name].assign(r=1.0), check_dtype=False, obj=name)


def _chunked(monkeypatch, chunk_bytes: int) -> None:
    """Every plain CSV parsed in chunks of ~``chunk_bytes`` (readers.iter_csv_chunks), however small."""
    monkeypatch.setattr(interaction_log, "_CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(csv_chunks, "CSV_CHUNK_BYTES", chunk_bytes)


@pytest.mark.parametrize("string_ids", [False, True])
def test_csv_parsed_in_chunks_writes_the_whole_file_dataset(tmp_path, monkeypatch, string_ids):
    """A plain CSV cut into chunks parsed on two threads (in memory and spilled) gives the bytes the
    whole-file reader gives; a column that widens further down (integer ids, then a string) is read
    again whole, as the whole-file reader types it."""
    log = _log(string_ids)
    widened = _log(False)
    widened["u"] = widened["u"].astype(object)
    widened.loc[NUM_ROWS - 7, "u"] = "late-string-id"
    kw = dict(name="log", protocol="recbole", seed=3, min_rating=2.0)
    for case, frame in (("plain", log), ("widened", widened)):
        path = tmp_path / f"{case}.csv"
        frame.to_csv(path, index=False)
        base = dict(path=str(path), user_column="u", item_column="i", timestamp_column="t", rating_column="r")
        out = {}
        for mode, budget, chunk_bytes in (("whole", 2048, 0), ("chunks", 2048, 50_000), ("chunks-disk", 1, 30_000)):
            if chunk_bytes:
                _chunked(monkeypatch, chunk_bytes)
            else:
                monkeypatch.undo()
            cfg = InteractionsDataConfig(**base, memory_budget_mb=budget)
            out[mode] = prepare_interactions(cfg, root=tmp_path / f"{case}-{mode}", **kw)
        for rel in ("train.parquet", "valid.parquet", "test.parquet", "vocab/users.parquet", "vocab/items.parquet"):
            assert len({(out[mode] / rel).read_bytes() for mode in out}) == 1, (case, rel)
        assert len({p.name for p in out.values()}) == 1
    users = pq.read_table(out["chunks"] / "vocab/users.parquet")["raw_id"]
    assert pa.types.is_large_string(users.type) or pa.types.is_string(users.type)  # read whole: strings


def test_chunked_csv_reader_gives_the_whole_file_columns(tmp_path):
    """readers.iter_csv_chunks against read_columns: header or positions, a BOM and CRLF endings,
    string ids (chunk buffers are reused: the strings must not point into them)."""
    log = _log(True)
    for name, text, columns, header in (
        ("h.csv", "\ufeff" + log.to_csv(index=False).replace("\n", "\r\n"), ["i", "u", "r"], True),
        ("n.tsv", log.to_csv(index=False, header=False, sep="\t"), ["1", "0"], False),
    ):
        path = tmp_path / name
        path.write_bytes(text.encode())
        delimiter = "\t" if name.endswith(".tsv") else ","
        whole = readers.read_columns(path, columns, delimiter=delimiter, header=header)
        for chunk_bytes in (2000, 100_000):
            got = pa.Table.from_batches(
                readers.iter_csv_chunks(
                    path, columns, delimiter=delimiter, header=header, threads=2, chunk_bytes=chunk_bytes
                )
            )
            assert got.combine_chunks().equals(whole.combine_chunks()), (name, chunk_bytes)
