"""FeatureLayout: for every KJT key of a batch, the towers it feeds, the table it looks up and its rows' source.

Worked out once, by :func:`feature_layout`, from the resolved config's switches (recsys.config's
``query_layout``: user id, sequence, query neighbours; ``data.history_length``; ``model.features``) and what
the dataset holds (categories, item neighbours). The batch builder (recsys/data/feature_builder.py), the model
builder (recsys/model/build.py), export (recsys/serving/bundle_writer.py) and serving (recsys/serving/bundle.py) read it
instead of those switches. Adding a feature is one entry in :func:`feature_layout` plus its row source
(recsys/data/row_sources.py). Plain Python: serving imports it without torch or torchrec.

A key's rows are stride B_q + C (recsys/data/features.py): its query entry fills rows [0, B_q), its
candidate entry rows [B_q, R); a tower without an entry gets empty rows. The default tiny run's layout::

    key        tower      table      source              query rows / candidate rows
    user       query      user       user_id             the user id (1)
    item       query      item       history             the history bag (recent items or a profile bag)
    item       candidate  item       item_id             the candidate item (1)
    category   query      category   history_categories  the categories of the history items
    category   candidate  category   item_categories     the candidate's categories
    neighbor   query      neighbor   history             the history bag again (model.query_neighbors)
    neighbor   candidate  neighbor   item_neighbors      the candidate's co-occurrence neighbours
    sequence   query      sequence   sequence            the history, oldest first, unpooled (sasrec)
    <side>     query      <table>    user_column         the user's ids of a users.parquet column
    <side>     query      <table>    history_column      the history items' ids of an items.parquet column
    <side>     candidate  <table>    item_column         the candidate's ids of an items.parquet column

Keys come in that order (side tables in the order ``model.features`` first names them); a tower reads its
pooled keys in the same order (``tower_keys``), the sequence key through the sequence encoder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # serving imports this module with torch, numpy and pyarrow alone: no config, no torchrec
    from recsys.data.dataset import RetrievalData

QUERY, CANDIDATE = "query", "candidate"

# row sources (recsys/data/row_sources.py fills each)
USER_ID = "user_id"
HISTORY = "history"  # the query's history bag: recent items or a profile bag (data.query_history)
ITEM_ID = "item_id"
HISTORY_CATEGORIES = "history_categories"
ITEM_CATEGORIES = "item_categories"
ITEM_NEIGHBORS = "item_neighbors"
SEQUENCE = "sequence"  # the history, oldest first, for the sequence encoder's unpooled lookup
USER_COLUMN = "user_column"  # model.features: a users.parquet column on the query tower
HISTORY_COLUMN = "history_column"  # an items.parquet column pooled over the history items
ITEM_COLUMN = "item_column"  # an items.parquet column of the candidate
COLUMN_SOURCES = {(QUERY, "users"): USER_COLUMN, (QUERY, "items"): HISTORY_COLUMN, (CANDIDATE, "items"): ITEM_COLUMN}

# the built-in keys (= tables), in KJT order
USER, ITEM, CATEGORY, NEIGHBOR, SEQUENCE_KEY = "user", "item", "category", "neighbor", "sequence"


@dataclass(frozen=True)
class FeatureSpec:
    """One tower's rows of one KJT key."""

    key: str  # the KJT key
    tower: str  # QUERY | CANDIDATE: the rows it fills and the tower that reads them
    table: str  # the table it looks up (one key per table: recsys/data/features.py says why)
    source: str  # where its rows come from (the constants above)
    feature: str = ""  # model.features' name, for the side columns

    @property
    def pooled(self) -> bool:
        """Whether the tower reads it pooled (an EmbeddingBag); the sequence key is looked up per position."""
        return self.source != SEQUENCE


@dataclass(frozen=True)
class SideEntry:
    """A model.features entry as the layout needs it: which file's column feeds which tower through which table."""

    name: str
    table: str
    tower: str  # QUERY | CANDIDATE
    source: str  # "users" | "items"


@dataclass(frozen=True)
class FeatureLayout:
    specs: tuple[FeatureSpec, ...]
    history_length: int  # data.history_length: the most history items a query carries (0: none)

    def keys(self) -> list[str]:
        """The KJT keys (= tables), in batch order."""
        return list(dict.fromkeys(s.key for s in self.specs))

    def tower_specs(self, tower: str) -> list[FeatureSpec]:
        """The pooled entries ``tower`` reads, in its input order."""
        return [s for s in self.specs if s.tower == tower and s.pooled]

    def tower_keys(self, tower: str) -> list[str]:
        return [s.key for s in self.tower_specs(tower)]

    def spec(self, key: str, tower: str) -> FeatureSpec | None:
        return next((s for s in self.specs if s.key == key and s.tower == tower), None)

    def side_specs(self, tower: str | None = None) -> list[FeatureSpec]:
        """The model.features entries (of ``tower``, or all), in key order."""
        return [s for s in self.specs if s.feature and tower in (None, s.tower)]

    @property
    def user_id(self) -> bool:
        return self.spec(USER, QUERY) is not None

    @property
    def sequence(self) -> bool:
        return self.spec(SEQUENCE_KEY, QUERY) is not None

    @property
    def query_neighbors(self) -> bool:
        return self.spec(NEIGHBOR, QUERY) is not None

    def describe(self) -> str:
        """One line per entry: ``key tower table source`` (the run log's record of it)."""
        return "\n".join(
            f"{s.key:<12} {s.tower:<9} {s.table:<12} {s.source}"
            + (f" (model.features.{s.feature})" if s.feature else "")
            for s in self.specs
        )


def feature_layout(
    *,
    history_length: int,
    user_id: bool = True,
    sequence: bool = False,
    query_neighbors: bool = False,
    has_categories: bool = True,
    has_neighbors: bool = False,
    side: Iterable[SideEntry] = (),
) -> FeatureLayout:
    """The layout of a model whose query sees ``user_id`` / its history (``history_length`` > 0; through the
    sequence encoder with ``sequence``; pooled through the neighbour table too with ``query_neighbors``), over
    data with or without item categories and neighbours, plus the side features ``side``.

    Without a history the query tower reads the user id alone (and its side features)."""
    if not user_id and history_length <= 0:
        raise ValueError(
            "model.query_user_id=false needs a history (data.history_length > 0): the query would see nothing"
        )
    bag = history_length > 0
    built_in = [
        (USER, QUERY, USER_ID, user_id),
        (ITEM, QUERY, HISTORY, bag and not sequence),
        (ITEM, CANDIDATE, ITEM_ID, True),
        (CATEGORY, QUERY, HISTORY_CATEGORIES, has_categories and bag),
        (CATEGORY, CANDIDATE, ITEM_CATEGORIES, has_categories),
        (NEIGHBOR, QUERY, HISTORY, has_neighbors and query_neighbors and bag and not sequence),
        (NEIGHBOR, CANDIDATE, ITEM_NEIGHBORS, has_neighbors),
        (SEQUENCE_KEY, QUERY, SEQUENCE, sequence),
    ]
    specs = [FeatureSpec(key, tower, key, source) for key, tower, source, wanted in built_in if wanted]
    return FeatureLayout(tuple(specs + side_specs(side)), history_length)


def side_specs(side: Iterable[SideEntry]) -> list[FeatureSpec]:
    """The side features' entries, grouped by table in the order the features first name them."""
    entries = list(side)
    tables = list(dict.fromkeys(e.table for e in entries))
    ordered = sorted(entries, key=lambda e: tables.index(e.table))  # stable: a table's features keep their order
    out = []
    for e in ordered:
        if (e.tower, e.source) not in COLUMN_SOURCES:
            raise ValueError(f"model.features.{e.name}: a {e.source} column cannot feed the {e.tower} tower")
        out.append(FeatureSpec(e.table, e.tower, e.table, COLUMN_SOURCES[(e.tower, e.source)], feature=e.name))
    return out


def side_entries(features: Sequence) -> list[SideEntry]:
    """``SideEntry``s of objects with ``name``, ``table``, ``tower`` and ``source`` (recsys.data.side_features'
    SideFeature, the data's resolved ``model.features``)."""
    return [SideEntry(f.name, f.table, f.tower, f.source) for f in features]


def data_layout(
    data: RetrievalData,
    history_length: int,
    *,
    user_id: bool = True,
    sequence: bool = False,
    query_neighbors: bool = False,
) -> FeatureLayout:
    """The layout of the switches (recsys.config's ``query_layout``) over ``data``: its categories, item neighbours
    and side features (``model.features``, read by recsys.data.side_features.with_side_features)."""
    if query_neighbors and not data.has_neighbors:
        raise ValueError("FeatureBuilder: query_neighbors needs a dataset loaded with item neighbours")
    return feature_layout(
        history_length=history_length,
        user_id=user_id,
        sequence=sequence,
        query_neighbors=query_neighbors,
        has_categories=data.has_categories,
        has_neighbors=data.has_neighbors,
        side=side_entries(data.side_features),
    )
