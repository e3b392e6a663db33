"""Any interaction log -> a dataset dir, by configuration alone (``data=interactions``, ``data=gowalla``).

    $ python -m data_pipelines.prepare data=interactions data.interactions.path=logs/clicks.csv.gz \\
          data.interactions.user_column=visitor data.interactions.item_column=sku \\
          data.interactions.timestamp_column=ts
    $ python -m data_pipelines.prepare data=gowalla        # LightGCN's given split, valid carved from train

Pipeline (one module a stage): read (``log``, over ``readers``: CSV / TSV / parquet / adjacency lists) -> raw ids (``log_columns.ids``:
int64 or strings by the identity rule) mapped to contiguous indices in ascending raw-id order -> ``filter_interactions``
(min rating, one row per (user, item): the latest, k-core) -> the protocol (``protocols``) -> ids compacted again
(``ids``) if the protocol dropped any -> side files (``side_files``) -> ``write_dataset_dir`` (atomic, ``prepare``),
cached in ``<root>/<name>-<protocol>-<key>`` by the sources' sha256 (``sources``) and every option.

Memory: recbole, loo and strong_generalization run through ``bucketed.split_log``, which streams
the log in record batches and holds at most about ``data.interactions.memory_budget_mb`` of rows
(past it, the log and its user buckets live in a work folder beside the dataset dir, removed
after), plus O(distinct users + items). The dataset is the same whatever the budget. ``given``
holds its files in memory (about 100 bytes a row at its peak); split a log larger than memory with
another protocol, or by user before preparing it.

Rules a user can rely on:

- **Ids are identities** (``log_columns``): stripped of surrounding whitespace, in the log and the
  side files alike; a text id is a number only when every id of the column, in every file, is a
  canonical integer (or ``id_type=int``): "007" and "7" are two ids.
- **Timestamps keep one unit** (``log_columns.TimeUnits``), told by size or ``timestamp_unit``, the
  same in every file; a mix is refused naming a row of each; meta.json ``timestamps`` names it.
- **No timestamps**: ``timestamp`` holds the row's position in the file, so "a user's latest
  items" means the last ones in the file (meta.json: ``"timestamps": "file_order"``).
- **No categories** (no items file, or no ``categories_column``): ``num_categories`` is 0 and the
  model has no category table (nothing zero-filled stands in for it).
- **Side files** (``items_path``, ``users_path``): their rows follow the dataset's ids (a user / item
  they do not list gets missing values); categorical columns become ids for ``model.features``
  (``side_columns``: which columns, the mapping, the vocab files and meta.json sizes).
- **protocol=given**: the vocabulary is the training file's (after its filters). Valid / test rows
  whose user or item never occurs in train, or whose (user, item) pair is in train, are dropped and
  counted in meta.json ``given_split.dropped``; a split left empty is an error. Without a valid
  file, ``valid_fraction`` of each user's train rows is carved out (``splits.carve_valid``): the
  test file is never used for any choice.
"""

from __future__ import annotations

from data_pipelines.interactions.log import log_format
from data_pipelines.interactions.prepare import PIPELINE_VERSION, cache_key, prepare_interactions

__all__ = ["PIPELINE_VERSION", "cache_key", "log_format", "prepare_interactions"]
