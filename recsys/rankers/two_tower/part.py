"""The two-tower as the bundle serves it: the query tower over its own unsharded tables (recsys/rankers/two_tower/query_encoder.py)
and the candidate tower's item embeddings. Files::

    items.npy            float32 [I, D]: the item embeddings (unit norm)
    query_encoder.pt     the QueryEncoder's weights (a state dict of tensors: what load_bundle reads)
    query_encoder.pt2    torch.export program of the same (batch and bag sizes dynamic), for torch.export consumers;
                         its loader unpickles objects, so load_bundle never reads it
    id_map_<table>.npy   model.id_mapping=managed: int64 [2, n], the managed table's hashed raw ids (ascending) and their
                         rows (the entry's "managed" holds each table's row ranges): ``RawIdMap``

The entry holds the encoder's layout (history_length, query_neighbors, poolings, side_features). A query reads each
user's latest ``history_length`` distinct items, their categories and the query-side feature columns (the bundle's
catalogue); with managed ids the tables are looked up by raw ids, an id a table does not hold getting its range's
shared last row, as in the trained model. The evaluation stage keeps only the items (its fit has no encoder);
``for_bundle`` adds the encoder the export built from the trained weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from recsys.data.layout import USER_COLUMN, USER_ID
from recsys.data.ragged import gather_ranges, gather_rows, segment_sum
from recsys.data.raw_ids import KEY_SPACE, hash_keys_numpy
from recsys.rankers.parts import BundleRun, Catalogue, Query, ServedPart, register_part
from recsys.rankers.two_tower.query_encoder import dynamic_shapes, example_inputs, load_encoder
from recsys.utils.safe_load import numpy_load

RAW_ID_TABLES = ("user", "item")  # the managed tables the encoder looks up by raw id (the rest by index)


@dataclass
class RawIdMap:
    """A managed table's raw id -> row map (recsys/model/managed.py), as the trained model's MCH modules held it."""

    keys: np.ndarray  # int64 [n], ascending: hashed raw ids (recsys.data.raw_ids.hash_keys_numpy)
    rows: np.ndarray  # int64 [n]: each key's row
    segments: list[int]  # row offsets of the ranks' ranges, then the table's rows

    def rows_of(self, raw_ids: np.ndarray) -> np.ndarray:
        """Rows of ``raw_ids`` (int64); an id the table does not hold gets the last row of its key's range."""
        keys = hash_keys_numpy(np.asarray(raw_ids, dtype=np.int64))
        pos = np.minimum(np.searchsorted(self.keys, keys), max(len(self.keys) - 1, 0))
        found = self.keys[pos] == keys if len(self.keys) else np.zeros(len(keys), dtype=bool)
        block = -(-KEY_SPACE // (len(self.segments) - 1))  # torchrec's row-wise bucket of a key
        last_rows = np.asarray(self.segments[1:], dtype=np.int64) - 1
        return np.where(found, self.rows[pos] if len(self.keys) else 0, last_rows[keys // block])


@register_part
class TwoTowerPart(ServedPart):
    ranker = "two_tower"

    def __init__(
        self,
        items: torch.Tensor,
        unranked: torch.Tensor | None = None,
        *,
        encoder=None,
        entry: dict | None = None,
        id_maps: dict[str, RawIdMap] | None = None,
    ) -> None:
        """``encoder``: the QueryEncoder (None in the run dir: the evaluation stage has only the items); ``entry``:
        its layout (history_length, query_neighbors, poolings, side_features); ``id_maps``: managed ids."""
        super().__init__(items, unranked)
        self.encoder, self.entry, self.id_maps = encoder, dict(entry or {}), id_maps
        self.history_length = int(self.entry.get("history_length", 0))

    @property
    def reads_users(self) -> bool:  # type: ignore[override]
        """A user-id table or a users.parquet side feature on the query tower (without an encoder: cannot tell)."""
        if self.encoder is None:
            return True
        return any(source in (USER_ID, USER_COLUMN) for _, source in self.encoder.inputs)

    def for_bundle(self, run: BundleRun) -> ServedPart:
        id_maps = None
        if run.id_maps is not None:
            id_maps = {
                t: RawIdMap(m["keys"], m["rows"], [int(v) for v in m["segments"]])
                for t, m in run.id_maps.items()
                if t in RAW_ID_TABLES
            }
        return TwoTowerPart(
            self.items, self.unranked, encoder=run.query_encoder(), entry=run.encoder_entry, id_maps=id_maps
        )

    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        """float32 [B, D], unit norm: the query tower on each user's row (none without a user) and latest items."""
        if self.encoder is None:
            raise ValueError("two_tower part: no query encoder (a run dir's served/ part; export the run to serve it)")
        anonymous = query.user_ids is None
        if query.raw is not None:  # raw ids (managed): the tables are looked up by them
            lengths, raw_items = _latest(query.lengths, query.raw[1], self.history_length)
            items = _latest(query.lengths, query.items, self.history_length)[1]
            user_keys = np.zeros(len(lengths), np.int64) if query.raw[0] is None else query.raw[0]
            users = np.full(len(lengths), -1)
            return self._encode_rows(
                catalogue, users, lengths, items, user_keys, raw_items, anonymous=query.raw[0] is None
            )
        users = np.full(len(query.lengths), -1) if anonymous else query.user_ids
        lengths, items = _latest(query.lengths, query.items, self.history_length)
        user_keys, item_keys = users, items
        if self.id_maps is not None:  # managed ids: the indices' raw ids, then the tables' rows
            assert catalogue.raw_ids is not None
            user_keys = users if anonymous else catalogue.raw_ids["users"][users]
            item_keys = catalogue.raw_ids["items"][items]
        return self._encode_rows(catalogue, users, lengths, items, user_keys, item_keys, anonymous=anonymous)

    def _encode_rows(self, catalogue, users, lengths, items, user_keys, item_keys, *, anonymous: bool) -> torch.Tensor:
        """The encoder on users / history items given by index (categories, side features; -1: unknown) and by what
        their tables are looked up with (``*_keys``: the indices, or raw ids when managed). ``anonymous``: no user
        row at all (the encoder pools an empty user bag: zeros)."""
        cat_lengths, cats = _gather_known(catalogue.category_indptr, catalogue.category_ids, items)
        per_user = segment_sum(cat_lengths, lengths)
        side = []
        for feature in self.entry.get("side_features", []):  # a user's own ids, or those of all their history items
            source, indptr, ids = catalogue.side_columns[feature["name"]]
            feature_lengths, values = _gather_known(indptr, ids, users if source == "users" else items)
            if source == "items":
                feature_lengths = segment_sum(feature_lengths, lengths)
            side += [torch.from_numpy(values.astype(np.int64)), _offsets(feature_lengths)]
        if self.id_maps is not None:
            user_keys = self.id_maps["user"].rows_of(user_keys) if "user" in self.id_maps else user_keys
            item_keys = self.id_maps["item"].rows_of(item_keys)
        if anonymous:
            user_keys = np.full(len(lengths), -1)  # QueryEncoder: a negative user id pools no row
        with torch.no_grad():
            return self.encoder(
                torch.from_numpy(np.asarray(user_keys, dtype=np.int64)),
                torch.from_numpy(np.asarray(item_keys, dtype=np.int64)),
                _offsets(lengths),
                torch.from_numpy(cats.astype(np.int64)),
                _offsets(per_user),
                side or None,
            )

    def save_own(self, folder: Path) -> dict:
        if self.encoder is None:
            return {}
        num_side = len(self.encoder.side_tables)
        program = torch.export.export(self.encoder, example_inputs(num_side), dynamic_shapes=dynamic_shapes(num_side))
        torch.export.save(program, str(folder / "query_encoder.pt2"))
        torch.save(self.encoder.state_dict(), folder / "query_encoder.pt")  # what load_bundle reads (weights only)
        entry = dict(self.entry)
        if self.id_maps is not None:
            for table, m in self.id_maps.items():
                np.save(folder / f"id_map_{table}.npy", np.stack([m.keys, m.rows]).astype(np.int64))
            entry["managed"] = {table: {"segments": m.segments} for table, m in self.id_maps.items()}
        return entry

    @classmethod
    def load_own(cls, folder: Path, entry: dict, items: torch.Tensor, unranked: torch.Tensor | None) -> ServedPart:
        if not (folder / "query_encoder.pt").is_file():  # the run dir's part: items only
            return cls(items, unranked, entry=entry)
        # the entry's values are the bundle's manifest.json's (<bundle>/parts/<i>-two_tower/ holds the weights)
        encoder = load_encoder(folder / "query_encoder.pt", entry, folder.parent.parent / "manifest.json")
        id_maps = None
        if "managed" in entry:
            id_maps = {}
            for table, info in entry["managed"].items():
                keys_rows = numpy_load(folder / f"id_map_{table}.npy")
                id_maps[table] = RawIdMap(keys_rows[0], keys_rows[1], [int(v) for v in info["segments"]])
        return cls(items, unranked, encoder=encoder, entry=entry, id_maps=id_maps)


def _offsets(lengths: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))


def _gather_known(indptr: np.ndarray, ids: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``gather_rows`` where an index of -1 (an id the dataset lacks: ``encode_raw``) has no values."""
    index = np.asarray(index, dtype=np.int64)
    known = index >= 0
    if known.all():
        return gather_rows(indptr, ids, index)
    lengths, values = gather_rows(indptr, ids, index[known])
    full = np.zeros(len(index), dtype=lengths.dtype)
    full[known] = lengths
    return full, values


def _latest(lengths: np.ndarray, items: np.ndarray, history_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Each user's last ``history_length`` items (all of them when it is 0 or they are fewer)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    if history_length <= 0 or not (lengths > history_length).any():
        return lengths, items
    ends = np.cumsum(lengths)
    kept = np.minimum(lengths, history_length)
    return kept, gather_ranges(ends - kept, ends, items)[1]
