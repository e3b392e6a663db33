"""FeatureLayout (recsys/data/layout.py): the entries each config shape gets, and the batches, the model and the
serving encoder all following it; a side feature is one more entry, nothing else changes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from data_pipelines.prepare import prepare_dataset
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.layout import CANDIDATE, QUERY, feature_layout
from recsys.job.assemble import open_dataset
from recsys.job.plan import run_layout
from recsys.rankers.two_tower.query_encoder import QueryEncoder
from tests.helpers.config import tiny_config
from tests.helpers.movielens import random_ratings, release_files, write_folder
from tests.helpers.run_task import run_task

Q, C = QUERY, CANDIDATE
USER = [("user", Q, "user", "user_id")]
ITEM = [("item", Q, "item", "history"), ("item", C, "item", "item_id")]
CATEGORY = [("category", Q, "category", "history_categories"), ("category", C, "category", "item_categories")]
NEIGHBOR = [("neighbor", C, "neighbor", "item_neighbors")]
QUERY_NEIGHBOR = [("neighbor", Q, "neighbor", "history")]
SASREC = ["data.protocol=loo", "data.query_history=recent", "model/query_encoder=sasrec"]

# config shape -> (overrides, what the data lacks, the layout's (key, tower, table, source) entries)
SHAPES = {
    "tiny": ([], (), [*ITEM, *CATEGORY, *QUERY_NEIGHBOR, *NEIGHBOR]),
    "user_id": (["model.query_user_id=true"], (), [*USER, *ITEM, *CATEGORY, *QUERY_NEIGHBOR, *NEIGHBOR]),
    "no_query_neighbors": (["model.query_neighbors=false"], (), [*ITEM, *CATEGORY, *NEIGHBOR]),
    "no_neighbors": (["data.item_neighbors=0"], ("neighbors",), [*ITEM, *CATEGORY]),
    "no_categories": ([], ("categories",), [*ITEM, *QUERY_NEIGHBOR, *NEIGHBOR]),
    "no_history": (["data.history_length=0", "model.query_user_id=true"], (), [*USER, ITEM[1], CATEGORY[1], *NEIGHBOR]),
    "sequence": (
        SASREC,  # the user id: a recent history resolves model.query_user_id to true
        (),
        [*USER, ITEM[1], *CATEGORY, *NEIGHBOR, ("sequence", Q, "sequence", "sequence")],
    ),
    "managed": (["model.id_mapping=managed"], (), [*ITEM, *CATEGORY, *QUERY_NEIGHBOR, *NEIGHBOR]),
    "attention_profile": (
        ["model/query_encoder=attention"],  # the profile bag, per position: no user id (null with profile)
        (),
        [ITEM[1], *CATEGORY, *NEIGHBOR, ("sequence", Q, "sequence", "sequence")],
    ),
}


def without(data, lacks):
    """``data`` as a dataset lacking item neighbours and / or categories would open."""
    if "neighbors" in lacks:
        data = dataclasses.replace(data, item_neighbor_indptr=None, item_neighbor_ids=None)
    if "categories" in lacks:
        data = dataclasses.replace(data, num_categories=0)
    return data


def entries(layout) -> list[tuple[str, str, str, str]]:
    return [(s.key, s.tower, s.table, s.source) for s in layout.specs]


def check_readers(cfg, data, layout) -> None:
    """The batch's keys, the towers' inputs and the serving encoder's tables are the layout's."""
    builder = FeatureBuilder(data, layout=layout)
    batch = builder.build(
        user_ids=np.array([0, 1]),
        hist_lengths=np.array([2, 0]),
        hist_items=np.array([3, 4]),
        candidate_item_ids=np.array([5, 6, 7]),
    )
    assert batch.features.keys() == layout.keys() == builder.keys
    for spec in layout.specs:  # a tower without an entry gets empty rows
        rows = batch.features[spec.key].lengths()
        if layout.spec(spec.key, Q) is None:
            assert rows[:2].sum() == 0
        if layout.spec(spec.key, C) is None:
            assert rows[2:].sum() == 0
    # the old switches give the same layout
    assert FeatureBuilder(data, cfg.data.history_length, **_switches(layout)).layout == layout
    model = run_task(cfg, data).model
    assert model.query_keys == layout.tower_keys(Q) and model.candidate_keys == layout.tower_keys(C)
    assert (model.ec is not None) == layout.sequence


def _switches(layout) -> dict[str, bool]:
    return {"user_id": layout.user_id, "sequence": layout.sequence, "query_neighbors": layout.query_neighbors}


@pytest.mark.parametrize("shape", SHAPES)
def test_each_config_shape_has_its_entries_and_every_reader_follows_them(shape, tiny_data):
    overrides, lacks, expected = SHAPES[shape]
    cfg = tiny_config([*overrides, *(["data.item_neighbors=0"] if "neighbors" in lacks else [])])
    data = without(tiny_data, lacks)
    layout = run_layout(cfg, data)
    assert entries(layout) == expected
    assert layout.history_length == cfg.data.history_length
    check_readers(cfg, data, layout)


def test_the_query_needs_something_to_read():
    with pytest.raises(ValueError, match="model.query_user_id=false needs a history"):
        feature_layout(history_length=0, user_id=False)


@pytest.fixture(scope="module")
def side_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml100k")
    write_folder(
        root, "ml-100k", release_files("ml-100k", random_ratings(120, 150, seed=0), num_movies=150, num_users=120)
    )
    movielens = ["data=movielens_100k", f"data.root={root}", "data.movielens.download=false", "data.item_neighbors=0"]
    plain = tiny_config(movielens)
    cfg = tiny_config([*movielens, "+model/side=movielens"])
    return plain, cfg, open_dataset(cfg, prepare_dataset(cfg.data))


def test_a_side_feature_is_one_entry_and_every_reader_follows_it(side_run):
    plain, cfg, data = side_run
    layout = run_layout(cfg, data)
    side = [
        ("gender", Q, "gender", "user_column", "gender"),
        ("age", Q, "age", "user_column", "age"),
        ("occupation", Q, "occupation", "user_column", "occupation"),
        ("year", C, "year", "item_column", "year"),  # the candidate's year and the history's share the table
        ("year", Q, "year", "history_column", "history_year"),
    ]
    assert [(*e, s.feature) for e, s in zip(entries(layout), layout.specs) if s.feature] == side
    # the rest is the layout of the same config without model.features
    without_side = dataclasses.replace(data, side_features=())
    assert entries(layout)[: -len(side)] == entries(run_layout(plain, without_side)) == [*ITEM, *CATEGORY]
    assert layout.tower_keys(Q) == ["item", "category", "gender", "age", "occupation", "year"]
    assert layout.tower_keys(C) == ["item", "category", "year"]
    check_readers(cfg, data, layout)
    # the serving encoder reads the query entries, in the tower's order, side tables after the built-in ones
    tables = {t: torch.zeros(n, 2) for t, n in data.table_num_rows.items()}
    encoder = QueryEncoder(tables, {t: "sum" for t in tables}, torch.nn.Linear(12, 2), layout.tower_specs(Q))
    assert encoder.inputs == (
        ("item", "history"),
        ("category", "history_categories"),
        ("gender", "user_column"),
        ("age", "user_column"),
        ("occupation", "user_column"),
        ("year", "history_column"),
    )
    assert encoder.side_tables == ("gender", "age", "occupation", "year")
    assert [k.split(".")[0] for k in encoder.state_dict()] == [
        "item",
        "category",
        "side",
        "side",
        "side",
        "side",
        "tower",
        "tower",
    ]
