"""Typed settings of the generic interactions source (``data.interactions.*`` in the Hydra config).

Defined here, beside the code that reads them, so that data_pipelines needs nothing from recsys;
``recsys.config.DataConfig`` embeds this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass
class InteractionsDataConfig:
    # one log to split by data.protocol (recbole / loo / strong_generalization) ...
    path: str = ""  # a CSV / TSV / parquet file (.gz / .zst read as such) or a folder of parquet files
    # ... or, with data.protocol=given, the user's own split (valid optional: carved from train when "")
    train_path: str = ""
    valid_path: str = ""
    test_path: str = ""
    format: str = "auto"  # "auto" (by extension; a folder is parquet, .txt adjacency) | "csv" | "tsv" | "parquet" | "adjacency"
    delimiter: str = ""  # CSV field separator; "" = "," for csv, tab for tsv
    header: bool = True  # false: the *_column settings are 0-based field positions ("0", "1", ...)
    user_column: str = "user_id"
    item_column: str = "item_id"
    timestamp_column: str = ""  # epoch seconds or ISO-8601 strings; "" = none: a user's items are ordered as in the file
    rating_column: str = ""  # "" = none (every row a positive; data.min_rating must then be 0)
    valid_fraction: float = 0.1  # protocol=given without valid_path: share of each user's train rows held out (seeded)
    # optional side files, keyed by the same raw ids as the log
    items_path: str = ""
    items_id_column: str = "item_id"
    categories_column: str = ""  # multi-valued category column of the items file; "" = items have no categories
    categories_separator: str = "|"
    users_path: str = ""
    users_id_column: str = "user_id"
    md5: Dict[str, str] = field(default_factory=dict)  # expected md5 by file name (data=gowalla pins the published ones)
