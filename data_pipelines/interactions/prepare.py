"""``prepare_interactions``: check the settings, find the dataset dir in the cache or split the log by
protocol, then write it with its side files (``write_dataset_dir``, atomic)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from data_pipelines.config import InteractionsDataConfig
from data_pipelines.dataset_dir import CATEGORIES_VOCAB, CODE_VERSION, is_prepared
from data_pipelines.dataset_writer import write_dataset_dir
from data_pipelines.errors import DatasetError
from data_pipelines.interactions.ids import id_kind
from data_pipelines.interactions.protocols import Split, given_split, split_log_file
from data_pipelines.interactions.side_files import items_table, users_table
from data_pipelines.interactions.sources import hash_sources, source_paths
from data_pipelines.splits import PROTOCOLS

# bump when this package's output for the same input changes (2: ids by the identity rule of log_columns,
# time units told and named in meta.json, raw_ids in meta.json)
PIPELINE_VERSION = "interactions/2"
SIDE_COLUMNS_VERSION = 1  # bump when side_columns.py's output for the same side file changes
_SIDE_COLUMNS = ("items_columns", "users_columns")
_FORMATS = ("auto", "csv", "tsv", "parquet", "adjacency")
VALID_CARVES = ("random", "latest")


def cache_key(sources: list[dict[str, str]], options: dict[str, Any]) -> str:
    """16 hex of sha256 over the sources' roles and sha256s, every option and the code versions."""
    payload = {
        "sources": sorted((s["role"], s["sha256"]) for s in sources),
        "options": options,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


class _CacheLookup:
    """The dataset dir's cache key and path, known once the sources are hashed (on another thread)."""

    def __init__(self, hashed: Future, options: dict[str, Any], root: Path, stem: str) -> None:
        self._hashed, self._options, self._root, self._stem = hashed, options, root, stem
        self._looked: list[Path | None] = []  # once looked: the complete dir, or None

    def located(self) -> tuple[list[dict[str, str]], str, Path]:
        """(sources, key, dataset dir); the hash's error (a damaged file, a wrong md5) comes first."""
        sources = self._hashed.result()
        key = cache_key(sources, self._options)
        return sources, key, self._root / f"{self._stem}-{key}"

    def prepared(self, wait: bool) -> Path | None:
        """The dataset dir if it is complete already (None: not, or not known yet and not ``wait``)."""
        if not self._looked and (wait or self._hashed.done()):
            _, key, out_dir = self.located()
            self._looked.append(out_dir if is_prepared(out_dir, key) else None)
        return self._looked[0] if self._looked else None


def prepare_interactions(
    cfg: InteractionsDataConfig,
    *,
    root: str | os.PathLike,
    name: str,
    protocol: str,
    seed: int = 0,
    min_rating: float = 0.0,
    min_user_interactions: int = 0,
    min_item_interactions: int = 0,
    num_heldout_users: int = 0,
) -> Path:
    """Prepare ``<root>/<name>-<protocol>-<key>`` from the configured files and return its absolute path.

    Idempotent: a complete dir whose meta.json carries the same key is returned untouched.
    """
    _check_settings(cfg, protocol, min_rating)
    paths = source_paths(cfg, protocol)
    filters = {
        "min_rating": float(min_rating),
        "min_user_interactions": int(min_user_interactions),
        "min_item_interactions": int(min_item_interactions),
    }
    options = _cache_options(cfg, protocol, seed, filters, num_heldout_users)
    root_dir = Path(root).absolute()
    # The sources' sha256 (the cache key) is computed on a thread while the log is parsed; a dataset
    # dir already there is found once it is known, and the parse stops. `given` reads its files after.
    with ThreadPoolExecutor(max_workers=1) as hashing:
        hashed = hashing.submit(hash_sources, paths, cfg.md5)
        lookup = _CacheLookup(hashed, options, root_dir, f"{name}-{protocol}")
        overlapped = protocol != "given" and cfg.memory_budget_mb > 0
        if not overlapped and (out_dir := lookup.prepared(wait=True)) is not None:
            return out_dir
        if cfg.memory_budget_mb <= 0:
            raise DatasetError(f"data.interactions.memory_budget_mb={cfg.memory_budget_mb}: must be positive (MiB)")
        root_dir.mkdir(parents=True, exist_ok=True)
        # spill and split files go beside the dataset dir (same disk: the split files are moved in); always removed
        with tempfile.TemporaryDirectory(dir=root_dir, prefix=f".{name}-{protocol}.work-") as work:
            if protocol == "given":
                split = given_split(cfg, paths, seed, filters)
            else:
                split = _split_unless_prepared(
                    cfg, paths["log"], Path(work), lookup, protocol, seed, filters, num_heldout_users
                )
                if split is None:
                    return lookup.prepared(wait=True)
            meta = {"name": name, "protocol": protocol, "seed": seed, "filters": filters}
            return _write(cfg, split, lookup, meta)


def _check_settings(cfg: InteractionsDataConfig, protocol: str, min_rating: float) -> None:
    if protocol not in (*PROTOCOLS, "given"):
        raise DatasetError(f"data.protocol={protocol!r}: unknown; known: {sorted((*PROTOCOLS, 'given'))}")
    if cfg.format not in _FORMATS:
        raise DatasetError(f"data.interactions.format={cfg.format!r}: expected one of {_FORMATS}")
    if cfg.valid_carve not in VALID_CARVES:
        raise DatasetError(f"data.interactions.valid_carve={cfg.valid_carve!r}: expected one of {VALID_CARVES}")
    if min_rating > 0 and not cfg.rating_column:
        raise DatasetError(
            f"data.min_rating={min_rating} needs ratings: set data.interactions.rating_column (or min_rating=0)"
        )


def _cache_options(
    cfg: InteractionsDataConfig, protocol: str, seed: int, filters: dict[str, Any], num_heldout_users: int
) -> dict[str, Any]:
    """Every option the cache key covers: not the paths (the sources' hashes stand for them) nor the budget."""
    options = {
        "protocol": protocol,
        "seed": seed,
        "filters": filters,
        "num_heldout_users": num_heldout_users,
        "reader": {
            k: v
            for k, v in asdict(cfg).items()
            if not k.endswith("_path") and k not in ("path", "md5", "memory_budget_mb", "valid_carve", *_SIDE_COLUMNS)
        },
    }
    if cfg.valid_carve != "random":  # the random carve's keys stay what they were
        options["valid_carve"] = cfg.valid_carve
    if cfg.items_path or cfg.users_path:  # keys of logs without side files stay what they were
        options["side_columns"] = {"version": SIDE_COLUMNS_VERSION, **{k: asdict(cfg)[k] for k in _SIDE_COLUMNS}}
    return options


def _split_unless_prepared(
    cfg: InteractionsDataConfig,
    path: Path,
    work: Path,
    lookup: _CacheLookup,
    protocol: str,
    seed: int,
    filters,
    num_heldout_users: int,
) -> Split | None:
    """The log split by ``protocol``; None when the dataset dir turns out to be there already."""
    try:
        return split_log_file(
            cfg,
            path,
            work,
            lookup.prepared,
            protocol=protocol,
            seed=seed,
            filters=filters,
            num_heldout_users=num_heldout_users,
        )
    except Exception:
        if lookup.prepared(wait=True) is not None:  # was never to be parsed
            return None
        raise


def _write(cfg: InteractionsDataConfig, split: Split, lookup: _CacheLookup, meta: dict[str, Any]) -> Path:
    """The dataset dir of ``split`` with its side files; ``meta`` holds name, protocol, seed and filters."""
    sources, key, out_dir = lookup.located()
    items, item_vocabs, item_features = items_table(cfg, split.items)
    users, user_vocabs, user_features = users_table(cfg, split.users)
    meta = {
        **meta,
        "num_users": len(split.users),
        "num_items": len(split.items),
        "num_categories": len(item_vocabs.get(CATEGORIES_VOCAB, ())),
        "raw_ids": {"users": id_kind(split.users), "items": id_kind(split.items)},
        "sources": sources,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
        "cache_key": key,
        **split.meta,
    }
    if item_features or user_features:  # ids per categorical side column: the tables model.features builds
        meta.update(item_features=item_features, user_features=user_features)
    train, valid, test = split.parts
    try:
        return write_dataset_dir(
            out_dir,
            train=train,
            valid=valid,
            test=test,
            items=items,
            users=users,
            meta=meta,
            extra_tables=split.tables | user_vocabs | item_vocabs,
        )
    except ValueError as e:
        raise DatasetError(f"{out_dir}: {e}") from None
