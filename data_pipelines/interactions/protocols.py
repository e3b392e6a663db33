"""A read log -> train / valid / test by protocol: recbole, loo and strong_generalization through
``bucketed.split_log`` (bounded memory), ``given`` from the user's own files (in memory)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from data_pipelines.bucketed import BucketedSplit, split_log
from data_pipelines.config import InteractionsDataConfig
from data_pipelines.dataset_dir import HELDOUT_USERS_FILE
from data_pipelines.errors import DatasetError
from data_pipelines.filters import filter_interactions
from data_pipelines.interactions.ids import compact, frame, same_type, vocabulary
from data_pipelines.interactions.log import read_log, stream_log
from data_pipelines.log_columns import TimeUnits
from data_pipelines.readers import ChunkRefused
from data_pipelines.splits import carve_valid

# The dataset dir if it is complete already; None: not, or not known yet and not told to wait.
Prepared = Callable[[bool], "Path | None"]


class Split(NamedTuple):
    """What a protocol gives the dataset dir: the three splits (frames, or files in the work folder),
    the raw ids kept (index = id), and the protocol's meta.json keys and extra files."""

    parts: list[pd.DataFrame | Path]
    users: pa.Array
    items: pa.Array
    meta: dict[str, Any]
    tables: dict[str, pd.DataFrame]


# ---------------------------------------------------------------- recbole, loo, strong_generalization


def split_log_file(
    cfg: InteractionsDataConfig,
    path: Path,
    work: Path,
    prepared: Prepared,
    **options: Any,
) -> Split | None:
    """The log through ``bucketed.split_log`` (``options``: protocol, seed, filters, num_heldout_users):
    in memory when it fits ``memory_budget_mb``, else on disk; None when ``prepared`` finds the dataset
    dir there already (the parse stops as soon as it does)."""
    try:
        result, units = _run(cfg, path, work, True, prepared, options)
    except ChunkRefused:  # a column wider further down, or a fault: the whole-file reader says which
        (work / "whole").mkdir()
        result, units = _run(cfg, path, work / "whole", False, prepared, options)
    if result is None:
        return None
    for name, n in result.counts.items():
        if n == 0:
            protocol, seed, filters = options["protocol"], options["seed"], options["filters"]
            raise DatasetError(
                f"{path}: protocol {protocol} (seed {seed}, filters {filters}) leaves the {name} split "
                f"empty ({list(result.counts.values())} train/valid/test rows); nothing was written"
            )
    meta: dict[str, Any] = {
        "protocol_options": result.options,
        "num_raw_interactions": result.num_raw_interactions,
        "num_buckets": result.num_buckets,
        "timestamps": units.name if cfg.timestamp_column else "file_order",
    }
    tables = _heldout_users(result, meta)
    return Split([result.files[s] for s in ("train", "valid", "test")], result.users, result.items, meta, tables)


def _run(
    cfg: InteractionsDataConfig, path: Path, folder: Path, chunked: bool, prepared: Prepared, options: dict[str, Any]
) -> tuple[BucketedSplit | None, TimeUnits]:
    """One attempt, with its own time unit (a chunked one refused starts again from the first row)."""
    units = TimeUnits(cfg.timestamp_unit)
    result = split_log(
        _until_prepared(stream_log(cfg, path, chunked=chunked, units=units), prepared),
        work=folder,
        label=str(path),
        memory_budget_bytes=int(cfg.memory_budget_mb) << 20,
        stop=lambda: prepared(False) is not None,
        **options,
    )
    return result, units


def _until_prepared(batches: Iterator[pa.RecordBatch], prepared: Prepared) -> Iterator[pa.RecordBatch]:
    """``batches`` until ``prepared`` finds the dataset dir; after the last one, waits until it knows."""
    with closing(batches):
        for batch in batches:
            if prepared(False) is not None:
                return
            yield batch
    prepared(True)


def _heldout_users(result: BucketedSplit, meta: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """strong_generalization: heldout_users.parquet, and its counts in ``meta``."""
    if result.heldout is None:
        return {}
    valid_u, test_u = result.heldout
    meta["strong_generalization"] = {
        "num_valid_users": len(valid_u),
        "num_test_users": len(test_u),
        "recall": "hits / min(K, |relevant|)",
        "ndcg_k": 100,
    }
    users = pd.DataFrame(
        {
            "user_id": np.concatenate([valid_u, test_u]).astype(np.int64),
            "split": ["valid"] * len(valid_u) + ["test"] * len(test_u),
        }
    )
    return {HELDOUT_USERS_FILE: users}


# ---------------------------------------------------------------- given


class _Train(NamedTuple):
    """The train rows' users, items and (user, item) pairs, for vectorised membership."""

    pairs: np.ndarray  # user_id * num_items + item_id
    users: np.ndarray  # bool per user_id
    items: np.ndarray  # bool per item_id
    num_items: int


def given_split(cfg: InteractionsDataConfig, paths: dict[str, Path], seed: int, filters: dict[str, Any]) -> Split:
    """The user's train / (valid) / test files: vocabulary from train; rows train cannot score dropped, counted."""
    logs, units = _read_given(cfg, paths)
    users, items = vocabulary(logs["train"]["user"]), vocabulary(logs["train"]["item"])
    train = filter_interactions(frame(logs["train"], users, items), **filters)
    if len(train) == 0:
        raise DatasetError(f"{paths['train']}: no interactions left after the filters {filters}")
    parts: dict[str, pd.DataFrame] = {"train": train}
    dropped: dict[str, dict[str, int]] = {}
    seen = _train_ids(train, len(users), len(items))
    for name in ("valid", "test"):
        if name in logs:
            parts[name], dropped[name] = _usable(logs[name], frame(logs[name], users, items), seen, filters)
            if len(parts[name]) == 0:
                raise DatasetError(
                    f"{paths[name]}: no {name} interaction is usable: of {logs[name].num_rows} rows, "
                    f"{dropped[name]['user_not_in_train']} have a user with no train rows, {dropped[name]['item_not_in_train']} "
                    f"an item never in train, {dropped[name]['pair_in_train']} a (user, item) pair already in train"
                )
    carved = "valid" not in parts
    if carved:
        parts["train"], parts["valid"] = _carve(cfg, parts["train"], paths["train"], seed)
    ordered = [parts["train"], parts["valid"], parts["test"]]
    users, items = compact(ordered, users, items)
    meta = {
        "given_split": {
            "valid": "carved from train" if carved else "given",
            "valid_fraction": cfg.valid_fraction if carved else None,
            "valid_carve": cfg.valid_carve if carved else None,
            "dropped": dropped,
        },
        "num_raw_interactions": int(sum(t.num_rows for t in logs.values())),
        "timestamps": units.name if cfg.timestamp_column else "file_order",
    }
    return Split(ordered, users, items, meta, {})


def _read_given(cfg: InteractionsDataConfig, paths: dict[str, Path]) -> tuple[dict[str, pa.Table], TimeUnits]:
    """The given files in one file order, one time unit and one id type."""
    logs: dict[str, pa.Table] = {}
    offset = 0
    units = TimeUnits(cfg.timestamp_unit)  # one unit for the three files
    for name in ("train", "valid", "test"):
        if name in paths:
            logs[name] = read_log(cfg, str(paths[name]), time_offset=offset, units=units)
            offset += logs[name].num_rows
    names = list(logs)
    user_cols = same_type(*(logs[s]["user"] for s in names))
    item_cols = same_type(*(logs[s]["item"] for s in names))
    for s, u, i in zip(names, user_cols, item_cols):
        logs[s] = logs[s].set_column(0, "user", u).set_column(1, "item", i)
    return logs, units


def _train_ids(train: pd.DataFrame, num_users: int, num_items: int) -> _Train:
    users = np.zeros(num_users, dtype=bool)
    users[train["user_id"].to_numpy()] = True
    items = np.zeros(num_items, dtype=bool)
    items[train["item_id"].to_numpy()] = True
    pairs = train["user_id"].to_numpy() * num_items + train["item_id"].to_numpy()
    return _Train(pairs, users, items, num_items)


def _usable(
    log: pa.Table, rows: pd.DataFrame, seen: _Train, filters: dict[str, Any]
) -> tuple[pd.DataFrame, dict[str, int]]:
    """A valid / test file's rows whose user and item are in train and whose pair is not; what was dropped."""
    u, i = rows["user_id"].to_numpy(), rows["item_id"].to_numpy()
    unknown_user = (u < 0) | ~seen.users[np.maximum(u, 0)]
    unknown_item = ~unknown_user & ((i < 0) | ~seen.items[np.maximum(i, 0)])
    known = ~unknown_user & ~unknown_item
    in_train = np.zeros(len(rows), dtype=bool)
    in_train[known] = np.isin(u[known] * seen.num_items + i[known], seen.pairs)
    usable = rows[known & ~in_train].reset_index(drop=True)
    kept = filter_interactions(usable, min_rating=filters["min_rating"])  # duplicates: the latest kept
    dropped = {
        "rows": int(log.num_rows),
        "user_not_in_train": int(unknown_user.sum()),
        "item_not_in_train": int(unknown_item.sum()),
        "pair_in_train": int(in_train.sum()),
        "duplicates_or_rating": int(len(usable) - len(kept)),
    }
    return kept, dropped


def _carve(cfg: InteractionsDataConfig, train: pd.DataFrame, path: Path, seed: int):
    """``valid_fraction`` of each user's train rows as the valid split (seeded); never the test file."""
    train, valid = carve_valid(train, fraction=cfg.valid_fraction, seed=seed, latest=cfg.valid_carve == "latest")
    if len(valid) == 0:
        raise DatasetError(
            f"{path}: data.interactions.valid_fraction={cfg.valid_fraction} carves no "
            "validation rows (every user has too few train rows); give a valid_path or a larger fraction"
        )
    return train, valid
