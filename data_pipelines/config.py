"""Typed settings of the data pipelines (``data.*`` in the Hydra config), and the one DictConfig -> dataclass step.

Defined here, beside the code that reads them, so that data_pipelines needs nothing of the recsys package;
``recsys.config.Config`` embeds :class:`DataConfig` and converts with the same :func:`to_typed`.
Names that must be one of a set are ``StrEnum`` fields: a wrong name fails when Hydra composes
the config (and an enum member compares and formats as its plain string).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf

from data_pipelines.errors import ConfigError, one_line

T = TypeVar("T")


class Choice(StrEnum):
    """A config value that must be one of a set; shown as its plain string, in messages too."""

    def __repr__(self) -> str:
        return repr(self.value)


class Source(Choice):
    """Which pipeline prepares the dataset dir."""

    synthetic = "synthetic"
    movielens = "movielens"
    interactions = "interactions"  # any log, data_pipelines/interactions/


class Protocol(Choice):
    """The split protocol (data_pipelines/splits.py; ``given``: the interactions source only)."""

    recbole = "recbole"
    loo = "loo"
    strong_generalization = "strong_generalization"
    given = "given"


class IdType(Choice):
    """How text ids are read (``data.interactions.id_type``; data_pipelines/log_columns.py)."""

    auto = "auto"
    string = "string"
    int = "int"


class TimeUnit(Choice):
    """The unit of numeric timestamps (``data.interactions.timestamp_unit``)."""

    auto = "auto"
    s = "s"
    ms = "ms"
    us = "us"
    ns = "ns"


@dataclass
class SyntheticDataConfig:
    """The generator's knobs; the one place of their defaults (``synthetic.DEFAULT_SPEC`` is built from them)."""

    num_users: int = 6040  # users; MovieLens-1M has 6040
    num_items: int = 3706  # items; MovieLens-1M has 3706 rated movies
    num_categories: int = 18  # categories (genres); MovieLens-1M has 18
    num_interactions: int = 1_000_000  # total interactions before the split
    latent_dim: int = 16  # dimension of the planted user / item factors
    min_interactions_per_user: int = 20  # floor on each user's count; MovieLens-1M keeps users with >= 20
    seed: int = 0  # generator seed (the split has its own, data.split_seed)
    # users.parquet gets a user_group column (0..N-1) that says something of each user's taste: a side
    # feature to try model.features on (synthetic.py, step 8); 0 = no such column
    num_user_groups: int = 0
    # item churn (synthetic.py, step 5): the time span is cut into this many periods and each item is on offer for
    # item_lifetime_periods consecutive ones, a user choosing only among the items on offer when they start; 0 = none
    churn_periods: int = 0
    item_lifetime_periods: int = 2  # with churn_periods > 0: periods each item lives (its first drawn uniformly)


@dataclass
class MovieLensDataConfig:
    release: str = "ml-1m"  # "ml-100k" | "ml-1m" | "ml-10m" | "ml-20m" | "ml-25m" | "ml-latest-small"
    url: str = (
        ""  # zip fetched when data.root has no copy; "" = https://files.grouplens.org/datasets/movielens/<release>.zip
    )
    md5: str = ""  # expected md5 of a downloaded zip; "" = GroupLens' published one (none for ml-latest-small), "skip" = no check
    download: bool = True  # false: never download; a missing copy is an error saying where to put it


@dataclass
class SideColumnConfig:
    """How prepare treats one column of a side file (``data.interactions.items_columns`` /
    ``users_columns``; data_pipelines/side_columns.py). Undeclared columns: strings, dictionaries and
    booleans (and lists of them) are categorical, except ``title`` (kept as text: the item's name in
    reports); numbers and times stay as the file has them."""

    # true: values -> contiguous ids 0.. (ascending value), so that model.features can use the column;
    # false: kept as the file has it (free text, a price). Declare an integer code (a zip code) to map it
    categorical: bool = True
    separator: str = ""  # several values in one string ("red|sale" with "|"): a list<int64> column; "" = one per row


@dataclass
class InteractionsDataConfig:
    # one log to split by data.protocol (recbole / loo / strong_generalization) ...
    path: str = ""  # a CSV / TSV / parquet file (.gz / .zst read as such) or a folder of parquet files
    # ... or, with data.protocol=given, the user's own split (valid optional: carved from train when "")
    train_path: str = ""  # the training file
    valid_path: str = ""  # the validation file (optional)
    test_path: str = ""  # the test file, never used for a choice
    format: str = (
        "auto"  # "auto" (by extension; a folder is parquet, .txt adjacency) | "csv" | "tsv" | "parquet" | "adjacency"
    )
    delimiter: str = ""  # CSV field separator; "" = "," for csv, tab for tsv
    header: bool = True  # false: the *_column settings are 0-based field positions ("0", "1", ...)
    user_column: str = "user_id"  # the column of user ids (with header=false: its position, "0")
    item_column: str = "item_id"  # the column of item ids (with header=false: its position, "1")
    # how text ids are read (log, given split and side files alike; surrounding whitespace is always
    # stripped): "auto" = integers only when every id of the column, in every file, is written as one
    # ("7", "-3": no leading zero, no "+"), else each id is its text ("007" and "7" are two ids);
    # "string" = always the text; "int" = every id must be an integer ("007" is 7)
    id_type: IdType = IdType.auto
    timestamp_column: str = (
        ""  # epoch numbers or ISO-8601 strings; "" = none: a user's items are ordered as in the file
    )
    # unit of numeric timestamps: "auto" = told by their size (seconds < 1e11 <= ms < 1e14 <= us < 1e17
    # <= ns), one unit per dataset (a column mixing them is refused, naming a row of each); or "s" |
    # "ms" | "us" | "ns": every number is taken as that unit. Kept in their unit (meta.json says which)
    timestamp_unit: TimeUnit = TimeUnit.auto
    rating_column: str = ""  # "" = none (every row a positive; data.min_rating must then be 0)
    memory_budget_mb: int = (
        2048  # MiB of rows held at once; a larger log is split in user buckets on disk (same dataset)
    )
    valid_fraction: float = 0.1  # protocol=given without valid_path: share of each user's train rows held out (seeded)
    # protocol=given without valid_path: which rows are held out: "random" (seeded) or each user's "latest" (by
    # timestamp, else file order), for a test file that holds later interactions than train
    valid_carve: str = "random"
    # optional side files, keyed by the same raw ids as the log
    items_path: str = ""  # the items file: item id -> categories and side columns (items.parquet)
    items_id_column: str = "item_id"  # the items file's column of the log's raw item ids
    categories_column: str = ""  # multi-valued category column of the items file; "" = items have no categories
    categories_separator: str = "|"  # splits a categories_column value into several categories
    users_path: str = ""  # the users file: user id -> side columns (users.parquet)
    users_id_column: str = "user_id"  # the users file's column of the log's raw user ids
    # side-file columns declared by name, e.g. {brand: {}, tags: {separator: "|"}, zip: {}} (a file or
    # ++data.interactions.items_columns={tags:{separator:'|'}}); {} = the rules of SideColumnConfig alone
    items_columns: dict[str, SideColumnConfig] = field(default_factory=dict)
    users_columns: dict[str, SideColumnConfig] = field(default_factory=dict)  # the same for the users file
    md5: dict[str, str] = field(
        default_factory=dict
    )  # expected md5 by file name (data=gowalla pins the published ones)


@dataclass
class DataConfig:
    name: str = MISSING  # dataset name, also names the prepared dir ("synthetic", "movielens_1m")
    source: Source = Source.synthetic  # which pipeline prepares it
    root: str = (
        "data"  # folder for prepared dataset dirs and MovieLens zips / extracted folders (relative to the launch dir)
    )
    protocol: Protocol = (
        Protocol.recbole
    )  # split protocol: recbole (random 8:1:1 per user) | loo | strong_generalization | given (interactions only)
    split_seed: int = 0  # seed of the split protocol
    min_rating: float = 0.0  # keep interactions rated >= this (stars; 4.0 = Liang's > 3.5 on half stars); 0 keeps all
    min_user_interactions: int = 0  # k-core: users need >= this many interactions after the rating filter; 0 disables
    min_item_interactions: int = 0  # k-core: items need >= this many (iterated with users until stable); 0 disables
    num_heldout_users: int = (
        0  # strong_generalization: users in each of valid and test; 0 = 10000 x users / 136677 (Liang's ML-20M share)
    )
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)  # source=synthetic: the generator
    movielens: MovieLensDataConfig = field(default_factory=MovieLensDataConfig)  # source=movielens: which release
    interactions: InteractionsDataConfig = field(default_factory=InteractionsDataConfig)  # source=interactions: a log


@dataclass
class PrepareConfig:
    """What ``python -m data_pipelines.prepare`` composes: the training config tree (so that the same
    groups, overrides and experiments apply), of which only ``data`` is read: its pipelines' keys typed here
    (:func:`pipeline_data`), the trainer's left to it."""

    data: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    optim: dict[str, Any] = field(default_factory=dict)
    sharding: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)
    tune: dict[str, Any] = field(default_factory=dict)
    run_name: str = "default"


def reject_unknown_keys(cfg: DictConfig, path: str = "") -> None:
    """Raise on a key no schema declares, e.g. one appended with '+' (``+cluster.hbm_gbb=1``).

    Hydra's ``+`` adds keys even to a structured node, and ``OmegaConf.to_object`` then drops
    them silently; this makes an appended typo fail like a plain one.
    """
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        known = {f.name for f in dataclasses.fields(schema)}
        for key in cfg.keys():
            if key not in known:
                raise ConfigError(f"Key '{key}' not in '{schema.__name__}'\n    full_key: {path}{key}")
    for key in cfg.keys():
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            reject_unknown_keys(child, f"{path}{key}.")


def to_typed(cfg: DictConfig, schema: type[T]) -> T:
    """A composed ``DictConfig`` -> an instance of the dataclass ``schema`` it was built on.

    Raises on keys no schema declares and on required (``???``) values left unset; types and enum
    names were checked by Hydra when it composed the config; a dataclass's own check (``__post_init__``) that
    refuses a value is a ``ConfigError`` too (one line, like the others).
    """
    reject_unknown_keys(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"config values required but not set: {', '.join(missing)}")
    try:
        obj: Any = OmegaConf.to_object(cfg)
    except ValueError as e:
        raise ConfigError(one_line(e)) from None
    if not isinstance(obj, schema):
        raise TypeError(f"expected a config built on the {schema.__name__} schema, got {type(obj).__name__}")
    return obj


def pipeline_data(data: DictConfig) -> tuple[DataConfig, list[str]]:
    """The composed ``data`` section as the pipelines' :class:`DataConfig` (its keys checked as ``to_typed`` checks
    them), and the keys it does not declare: the trainer's (``data.history_length``, ...), which recsys's own schema
    checks when it trains."""
    known = {f.name for f in dataclasses.fields(DataConfig)}
    others = sorted(str(k) for k in data.keys() if k not in known)
    section = OmegaConf.masked_copy(data, [k for k in data.keys() if k in known])
    try:
        typed = OmegaConf.merge(OmegaConf.structured(DataConfig), section)
    except Exception as e:  # a value of the wrong type or outside its set, named with its key
        raise ConfigError(one_line(e).replace("full_key: ", "full_key: data.")) from None
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        raise ConfigError(f"config values required but not set: {', '.join(f'data.{k}' for k in missing)}")
    return to_typed(typed, DataConfig), [f"data.{k}" for k in others]
