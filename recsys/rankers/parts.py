"""Servable parts: what a dot-product ranker ships in the serving bundle, and the registry the bundle loads them by.

A ranker whose fit scores <query(u), item(i)> (a ``DotProductFit``) is served as a :class:`ServedPart`: its item
vectors [I, D] and an ``encode`` that turns queries (user ids, histories) into query vectors [B, D]. The served
ranker is :class:`Served`: one part, or several fused into one more inner product (recsys/rankers/fusion.py)::

    evaluation stage   fit.served(point)       -> Served, saved into <run dir>/served/     (what the fit knows)
    recsys.export      served.for_bundle(run)  -> Served, saved into <bundle>/             (+ what only the run has)
    load_bundle        Served.load(folder)     -> each part by its ranker's name, through ``part_type``

Nothing here names a ranker: each part type registers itself (``register_part``), and a bundle's manifest says which
ones it holds. Imports torch and numpy only: a serving process loads parts without torchrec or Hydra.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from recsys.rankers.builtin import import_builtin
from recsys.utils.safe_load import numpy_load

# the built-in part types (each ranker package's part.py) are imported when a name is first looked up; a plug-in's
# registers itself on import


@dataclass(frozen=True)
class Query:
    """Queries as the bundle hands them to its parts, checked: ``user_ids`` (dataset indices; None: queries without
    a user) and each query's distinct history items, oldest first (``lengths`` per query, ``items`` concatenated;
    -1: an item the catalogue lacks, when the queries came as raw ids). ``raw``: with raw ids (a managed bundle's
    ``encode_raw``), the users' and the items' raw ids, for parts that look their tables up by them."""

    user_ids: np.ndarray | None
    lengths: np.ndarray
    items: np.ndarray
    raw: tuple[np.ndarray | None, np.ndarray] | None = None


@dataclass(frozen=True)
class Catalogue:
    """What the bundle knows of its users and items, for every part: sizes, the items' categories, the query-side
    feature columns (name -> (source "users" | "items", indptr, ids)), and the raw id of every index (managed ids)."""

    num_users: int
    num_items: int
    category_indptr: np.ndarray
    category_ids: np.ndarray
    side_columns: dict[str, tuple[str, np.ndarray, np.ndarray]] = field(default_factory=dict)
    raw_ids: dict[str, np.ndarray] | None = None  # "users" / "items" -> int64 [num_users] / [num_items]


@dataclass
class BundleRun:
    """What ``recsys.export`` offers a part beyond its fit (``ServedPart.for_bundle``): the trained run's own pieces,
    built only when a part asks. ``query_encoder``: the two-tower's query side; ``encoder_entry``: its layout for the
    manifest; ``id_maps``: the managed tables' raw id -> row maps."""

    query_encoder: Callable[[], Any]
    encoder_entry: dict
    id_maps: dict | None = None


class ServedPart(ABC):
    """One dot-product ranker at its chosen point: item vectors float32 [I, D], and ``encode``."""

    ranker: ClassVar[str] = ""  # the eval.rankers name it serves (``register_part``)
    # whether its queries read the user (a user row, a user's side features): the bundle refuses user ids given to a
    # ranker none of whose parts reads them; true unless a part type says otherwise (a plug-in's are never refused)
    reads_users: ClassVar[bool] = True

    def __init__(self, items: torch.Tensor, unranked: torch.Tensor | None = None) -> None:
        """``unranked``: bool [I], items it has no vector of its own for, never recommended; None: none."""
        self.items = items.float().contiguous()
        self.unranked = unranked if unranked is not None and bool(unranked.any()) else None

    @abstractmethod
    def encode(self, query: Query, catalogue: Catalogue) -> torch.Tensor:
        """float32 [B, D]: each query's vector."""

    def for_bundle(self, run: BundleRun) -> ServedPart:
        """This part with what the bundle needs beyond the fit (the two-tower: its query encoder)."""
        return self

    def save(self, folder: Path) -> dict:
        """Write the part into ``folder`` (items.npy, unranked.npy, and ``save_own``'s files); returns its manifest
        entry (JSON)."""
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "items.npy", self.items.numpy().astype(np.float32))
        if self.unranked is not None:
            np.save(folder / "unranked.npy", np.flatnonzero(self.unranked.numpy()).astype(np.int64))
        return {"ranker": self.ranker, "dim": int(self.items.shape[1]), **self.save_own(folder)}

    def save_own(self, folder: Path) -> dict:
        """The part type's own files; returns what its manifest entry adds."""
        return {}

    @classmethod
    def load(cls, folder: Path, entry: dict) -> ServedPart:
        """A part from ``save``'s folder and entry."""
        items = torch.from_numpy(numpy_load(folder / "items.npy"))
        unranked = None
        if (folder / "unranked.npy").is_file():
            unranked = torch.zeros(items.shape[0], dtype=torch.bool)
            unranked[torch.from_numpy(numpy_load(folder / "unranked.npy"))] = True
        return cls.load_own(folder, entry, items, unranked)

    @classmethod
    @abstractmethod
    def load_own(cls, folder: Path, entry: dict, items: torch.Tensor, unranked: torch.Tensor | None) -> ServedPart:
        """The part type's own files, with the items ``load`` read."""


_PART_TYPES: dict[str, type[ServedPart]] = {}


def register_part(cls: type[ServedPart]) -> type[ServedPart]:
    """Class decorator: ``cls`` serves the ranker ``cls.ranker`` (a plug-in ranker's part registers itself so)."""
    if not cls.ranker or "+" in cls.ranker:
        raise ValueError(f"{cls.__name__}.ranker={cls.ranker!r}: a ranker's name, without '+'")
    _PART_TYPES[cls.ranker] = cls
    return cls


def part_type(ranker: str, where: str = "") -> type[ServedPart]:
    """The registered part type of ``ranker``; a ValueError naming ``where`` (a manifest) and the known ones."""
    if ranker not in _PART_TYPES:
        import_builtin("part")
    if ranker not in _PART_TYPES:
        raise ValueError(
            f"{where or 'ranker'}: no servable part {ranker!r} is registered (known: {', '.join(sorted(_PART_TYPES))}); "
            "a plug-in ranker's part registers itself when its module is imported: import it before loading"
        )
    return _PART_TYPES[ranker]


def servable(ranker: str) -> bool:
    """Whether ``ranker`` has a registered servable part."""
    try:
        part_type(ranker)
    except ValueError:
        return False
    return True


def either(masks: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """The union of bool masks (None: no item), None when every one is None."""
    out = None
    for mask in masks:
        if mask is not None:
            out = mask.clone() if out is None else out | mask
    return out
