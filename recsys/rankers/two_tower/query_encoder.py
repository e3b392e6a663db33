"""The serving bundle's query encoder: the two-tower's query side with its own unsharded tables.

Built at export from the run's FeatureLayout (recsys/data/layout.py) and rebuilt by ``load_bundle``
(recsys/serving/bundle.py) from the bundle's manifest and weights: torch only, no torchrec, no config.
A query encoder that reads the history per position (sasrec, attention, gated: recsys/components/query_encoders)
ships its module and its item-sized ``sequence`` table; the manifest's ``sequence_encoder`` entry rebuilds it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from recsys.components.query_encoders.sequence import padded_rows
from recsys.components.registry import component_configs
from recsys.data.layout import (
    HISTORY,
    HISTORY_COLUMN,
    QUERY,
    SEQUENCE,
    SEQUENCE_KEY,
    USER_COLUMN,
    USER_ID,
    FeatureSpec,
    SideEntry,
    feature_layout,
)
from recsys.utils.safe_load import torch_load_weights

SIDE_SOURCES = (USER_COLUMN, HISTORY_COLUMN)  # a side feature's (ids, offsets) pair of the ``side`` argument
QUERY_ENCODERS = "recsys.components.query_encoders"  # the package whose Config the manifest's sequence_encoder names


class QueryEncoder(nn.Module):
    """The query tower over plain nn.EmbeddingBag tables, one per pooled query entry of the layout.

    forward(user_ids [B] (-1: no user), history_item_ids [N], history_offsets [B],
            history_categories [M], history_category_offsets [B],
            side [ids_0, offsets_0 [B], ids_1, offsets_1 [B], ...]) -> [B, D], unit norm.
    Offsets are bag starts (PyTorch EmbeddingBag convention); bags may be empty (pool to 0).
    ``inputs``: the query tower's pooled entries in its order (``FeatureLayout.tower_specs("query")``), each
    table reading its source: the user id, the history bag (the item table; the neighbour table too with
    model.query_neighbors), the history's categories, or the next (ids, offsets) pair of ``side`` (the
    query-tower side features, model.features, in the tower's order; None without them).
    With a ``sequence_encoder`` the history's items, oldest first, are looked up per position in
    ``tables["sequence"]`` and padded to ``B x L x D_s`` as training pads them (recsys.model.two_tower.encode_history);
    its output goes first in the tower's input, and with ``blend_user`` it reads the user id's columns and takes
    their place (the gated blend).
    """

    def __init__(
        self,
        tables: dict[str, torch.Tensor],
        poolings: dict[str, str],
        tower: nn.Sequential,
        inputs: Sequence[FeatureSpec],
        item_bias: bool = False,
        sequence_encoder: nn.Module | None = None,
        blend_user: bool = False,
    ) -> None:
        """``item_bias``: the model's (model.item_bias): the query vector ends with the constant 1 that meets each
        item vector's bias. ``sequence_encoder``: the query encoder's module (``max_length`` positions)."""
        super().__init__()
        self.item_bias = item_bias
        self.inputs = tuple((s.table, s.source) for s in inputs if s.source != SEQUENCE)
        self.sequence_encoder = sequence_encoder
        self.blend_user = blend_user and sequence_encoder is not None
        if sequence_encoder is not None:
            self.sequence = nn.Embedding.from_pretrained(tables[SEQUENCE_KEY], freeze=True)
        for table, source in self.inputs:  # weights named <table>.weight, side.<table>.weight: the bundle's
            if source not in SIDE_SOURCES:
                self.add_module(
                    table, nn.EmbeddingBag.from_pretrained(tables[table], mode=poolings[table], freeze=True)
                )
        self.side_tables = tuple(table for table, source in self.inputs if source in SIDE_SOURCES)
        self.side = nn.ModuleDict(
            {t: nn.EmbeddingBag.from_pretrained(tables[t], mode=poolings[t], freeze=True) for t in self.side_tables}
        )
        self.tower = tower

    def forward(
        self,
        user_ids: torch.Tensor,
        history_item_ids: torch.Tensor,
        history_offsets: torch.Tensor,
        history_categories: torch.Tensor,
        history_category_offsets: torch.Tensor,
        side: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        pooled, j, user = [], 0, None  # j: the next side feature's pair
        for table, source in self.inputs:
            if source in SIDE_SOURCES:
                assert side is not None, "QueryEncoder: side features need the side argument"
                pooled.append(self.side[table](side[2 * j], side[2 * j + 1]))
                j += 1
            elif source == USER_ID:  # a negative id: a query without a user, no row (an empty bag pools to 0)
                bags = torch.arange(user_ids.shape[0], device=user_ids.device)
                rows = getattr(self, table)(user_ids.clamp(min=0), bags)
                user = rows * (user_ids >= 0).unsqueeze(1).to(rows.dtype)
                if not self.blend_user:
                    pooled.append(user)
            elif source == HISTORY:  # the item table's bag, and the neighbour table's with model.query_neighbors
                pooled.append(getattr(self, table)(history_item_ids, history_offsets))
            else:  # history_categories
                pooled.append(getattr(self, table)(history_categories, history_category_offsets))
        if self.sequence_encoder is not None:
            items, lengths = self._padded_history(history_item_ids, history_offsets)
            blend = (user,) if self.blend_user else ()
            pooled.insert(0, self.sequence_encoder(items, lengths, *blend))
        query = F.normalize(self.tower(torch.cat(pooled, dim=1)), dim=-1)
        return torch.cat([query, query.new_ones(query.shape[0], 1)], dim=1) if self.item_bias else query

    def _padded_history(self, ids: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each bag's items (oldest first) looked up per position: ``B x L x D_s`` and its lengths, padded as training
        pads them (the bundle's part hands over at most the latest L)."""
        lengths = torch.diff(offsets, append=offsets.new_full((1,), ids.shape[0]))
        return padded_rows(self.sequence(ids), offsets, lengths, self.sequence_encoder.max_length)


def example_inputs(num_side: int = 0) -> tuple:
    """Inputs used to trace the encoder: 3 users, one with an empty history (sizes >= 2, or
    torch.export specialises a dynamic size to the constant 0 or 1); ``num_side`` side (ids, offsets) pairs."""
    inputs: tuple = (
        torch.tensor([0, 0, 0]),
        torch.tensor([0, 0, 0, 0]),
        torch.tensor([0, 2, 4]),
        torch.tensor([0, 0, 0, 0, 0]),
        torch.tensor([0, 3, 5]),
    )
    if num_side:  # without side features the program keeps its five inputs
        inputs += ([t for _ in range(num_side) for t in (torch.tensor([0, 0, 0, 0, 0, 0]), torch.tensor([0, 2, 4]))],)
    return inputs


def dynamic_shapes(num_side: int = 0) -> dict:
    batch = torch.export.Dim("batch", min=1)
    shapes: dict = {
        "user_ids": {0: batch},
        "history_item_ids": {0: torch.export.Dim("history", min=0)},
        "history_offsets": {0: batch},
        "history_categories": {0: torch.export.Dim("categories", min=0)},
        "history_category_offsets": {0: batch},
    }
    if num_side:
        shapes["side"] = [
            shape for j in range(num_side) for shape in ({0: torch.export.Dim(f"side_{j}", min=0)}, {0: batch})
        ]
    return shapes


def _tower_from_weights(state: dict[str, torch.Tensor], path: Path) -> nn.Sequential:
    """The query tower's layers from its weights' names and shapes: Linear at each ``tower.<i>``, ReLU
    between them (recsys.model.two_tower.mlp's layout)."""
    linear = sorted(int(key.split(".")[1]) for key in state if key.startswith("tower.") and key.endswith(".weight"))
    if not linear or linear != list(range(0, 2 * len(linear), 2)):
        raise ValueError(f"{path}: tower layers {linear}: expected Linear layers at 0, 2, 4, ...")
    layers = []
    for i in linear:
        out_dim, in_dim = state[f"tower.{i}.weight"].shape
        layers += [nn.Linear(in_dim, out_dim)] + ([nn.ReLU()] if i != linear[-1] else [])
    return nn.Sequential(*layers)


def load_encoder(path: Path, manifest: dict, manifest_path: Path) -> QueryEncoder:
    """The bundle's QueryEncoder: its layout from the manifest (history_length, query_neighbors, side_features) and
    the tables whose weights it holds; every weight checked and used."""
    state = torch_load_weights(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict of tensors")
    poolings = manifest.get("poolings", {})
    history_length = manifest.get("history_length", 0)
    sequence_encoder, blend_user = _sequence_encoder(manifest.get("sequence_encoder"), manifest_path)
    sequence = sequence_encoder is not None
    with_neighbors = history_length > 0 and not sequence and bool(manifest.get("query_neighbors", False))
    # a query is its history (a bag of the item table, or the sequence table's rows), its user id, or both
    needed = ("user",) if history_length <= 0 or blend_user else ()
    needed += ("item",) if history_length > 0 and not sequence else ()
    needed += ("neighbor",) if with_neighbors else ()
    if sequence and "sequence.weight" not in state:
        raise ValueError(f"{path}: no weights for the sequence table (manifest sequence_encoder)")
    tables = [t for t in ("user", "item", "category", "neighbor") if f"{t}.weight" in state]  # the pooled built-ins
    for table in (*needed, *tables):
        if f"{table}.weight" not in state:
            raise ValueError(f"{path}: no weights for table {table!r}")
        if poolings.get(table) not in ("sum", "mean"):
            raise ValueError(f"{manifest_path}: poolings.{table} is {poolings.get(table)!r}, expected 'sum' or 'mean'")
    side = [SideEntry(f["name"], f["table"], QUERY, f["source"]) for f in manifest.get("side_features", [])]
    for table in dict.fromkeys(s.table for s in side):
        if f"side.{table}.weight" not in state:
            raise ValueError(f"{path}: no weights for side table {table!r} (manifest side_features)")
        if poolings.get(table) not in ("sum", "mean"):
            raise ValueError(f"{manifest_path}: poolings.{table} is {poolings.get(table)!r}, expected 'sum' or 'mean'")
    layout = feature_layout(
        history_length=history_length,
        user_id="user" in tables,
        sequence=sequence,
        query_neighbors=with_neighbors,
        has_categories="category" in tables,
        has_neighbors=with_neighbors,
        side=side,
    )
    weights = {t: state[f"{t}.weight"] for t in tables} | {s.table: state[f"side.{s.table}.weight"] for s in side}
    if sequence:
        weights[SEQUENCE_KEY] = state["sequence.weight"]
    item_bias = manifest.get("item_bias", False)  # bundles before model.item_bias: none
    if not isinstance(item_bias, bool):
        raise ValueError(f"{manifest_path}: item_bias is {item_bias!r}, expected true or false")
    tower = _tower_from_weights(state, path)
    encoder = QueryEncoder(
        weights, poolings, tower, layout.tower_specs(QUERY), item_bias=item_bias,
        sequence_encoder=sequence_encoder, blend_user=blend_user,
    )  # fmt: skip
    encoder.load_state_dict(state)  # strict: every tensor is used, none is missing
    return encoder.eval()


def sequence_entry(config, max_length: int, user_dim: int) -> dict:
    """The manifest's ``sequence_encoder``: the query encoder's Config (a component of QUERY_ENCODERS) and the
    sizes its ``build`` took, what ``load_encoder`` rebuilds the module from before loading its weights."""
    return {"config": dataclasses.asdict(config), "max_length": max_length, "user_dim": user_dim}


def _sequence_encoder(entry: dict | None, manifest_path: Path) -> tuple[nn.Module | None, bool]:
    """(the module the manifest's ``sequence_encoder`` entry builds, whether it blends the user id in); (None,
    False) without one: the query pools its history as a bag."""
    if entry is None:
        return None, False
    configs = component_configs(QUERY_ENCODERS)
    fields = dict(entry.get("config") or {})
    name = fields.get("name")
    if name not in configs:
        raise ValueError(
            f"{manifest_path}: sequence_encoder.config.name is {name!r}, expected one of {', '.join(configs)}"
        )
    try:
        config = configs[name](**fields)
        module = config.build(int(entry["max_length"]), int(entry.get("user_dim", 0)))
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(f"{manifest_path}: sequence_encoder {entry!r}: {e}") from None
    if not config.sequence:
        raise ValueError(f"{manifest_path}: sequence_encoder.config.name={name!r} reads no sequence")
    return module, bool(config.user)
