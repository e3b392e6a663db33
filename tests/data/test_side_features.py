"""model.features: MovieLens side columns (gender / age / occupation of users, year bucket of items) fed
to the towers by configuration, end to end: KJT layout, tables, training on 1 and 2 ranks, evaluation, export."""

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from data_pipelines.prepare import prepare_dataset
from data_pipelines.synthetic import TINY_SPEC, cache_key, generate
from recsys.config import query_layout
from recsys.config.fingerprint import config_fingerprint
from recsys.data.dataset import load_dataset
from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.side_features import with_side_features
from tests.helpers.config import tiny_config
from tests.helpers.launch import launch
from tests.helpers.movielens import OCCUPATIONS_100K, random_ratings, release_files, write_folder

SIDE = ["+model/side=movielens"]  # conf/model/side/movielens.yaml
# tables as the fixture's meta.json sizes them: 2 genders, 7 age buckets, ml-100k's used occupations, 13 year buckets
SIDE_ROWS = {"gender": 2, "age": 7, "occupation": len(OCCUPATIONS_100K), "year": 13}
TRAIN = ["trainer.epochs=2", "trainer.max_steps_per_epoch=4", "trainer.global_batch_size=64", "eval.batch_size=64"]


def movielens_overrides(root) -> list[str]:
    return ["data=movielens_100k", f"data.root={root}", "data.movielens.download=false"]


@pytest.fixture(scope="module")
def ml_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ml100k")
    files = release_files("ml-100k", random_ratings(120, 150, seed=0), num_movies=150, num_users=120)
    write_folder(root, "ml-100k", files)
    return root


def side_data(root, overrides=()):
    cfg = tiny_config([*movielens_overrides(root), *SIDE, *overrides])
    return cfg, with_side_features(load_dataset(prepare_dataset(cfg.data)), cfg.model.features)


def test_defaults_keep_their_fingerprints_and_dataset_dirs():
    # computed on main before model.features and data.synthetic.num_user_groups existed
    # (and data.item_neighbors: tiny and the random-split protocols now turn it on; off, they keep theirs; and
    # model.item_bias and model.loss.mask_history, on by default since: off, they keep theirs)
    old = ["data.item_neighbors=0", "model.item_bias=false", "model.loss.mask_history=false"]
    assert config_fingerprint(tiny_config(old)) == "aba86887940c0bfb"
    assert config_fingerprint(tiny_config(["data=movielens_100k", *old])) == "3c9f12bf3098fe57"
    assert config_fingerprint(tiny_config()) != "aba86887940c0bfb"
    assert cache_key(TINY_SPEC, "recbole", 0) == "f0807d96cd8e0339"
    assert config_fingerprint(tiny_config(SIDE)) != "aba86887940c0bfb"


def test_movielens_side_experiment_composes():
    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config
    from tests.helpers.config import CONF_DIR

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=["+experiment=movielens_side"]))
    assert cfg.data.name == "movielens_1m" and cfg.model.tables["category"].embedding_dim == 16
    assert list(cfg.model.features) == ["gender", "age", "occupation", "year", "history_year"]
    assert cfg.model.features["history_year"].table == "year" and cfg.model.features["year"].tower == "candidate"


def test_batch_layout_and_table_sizes_follow_the_config(ml_root):
    cfg, data = side_data(ml_root)
    assert data.table_num_rows == {"user": 120, "item": 150, "category": data.num_categories, **SIDE_ROWS}
    builder = FeatureBuilder(data, cfg.data.history_length, user_id=False)
    assert builder.keys == ["item", "category", "gender", "age", "occupation", "year"]

    users, hist_lengths, hist_items, candidates = (
        np.array([3, 7]),
        np.array([2, 1]),
        np.array([5, 9, 4]),
        np.array([1, 2, 8]),
    )
    batch = builder.build(
        user_ids=users, hist_lengths=hist_lengths, hist_items=hist_items, candidate_item_ids=candidates
    )
    kjt = batch.features.to_dict()
    by_name = {f.name: f for f in data.side_features}
    gender, year = by_name["gender"], by_name["year"]
    # query rows: the user's gender; candidate rows: nothing
    assert kjt["gender"].lengths().tolist() == [1, 1, 0, 0, 0]
    assert kjt["gender"].values().tolist() == gender.ids[users].tolist()
    # year: the history items' years on query rows (2 and 1 of them), the candidate's own year after
    assert kjt["year"].lengths().tolist() == [2, 1, 1, 1, 1]
    assert kjt["year"].values().tolist() == year.ids[np.r_[hist_items, candidates]].tolist()
    assert set(gender.ids.tolist()) == {0, 1}  # 0 F / 1 M, both in the fixture's u.user


def test_out_of_range_ids_are_refused_before_the_lookup(ml_root):
    _, data = side_data(ml_root)
    gender = next(f for f in data.side_features if f.name == "gender")
    small = dataclasses.replace(gender, num_ids=1)  # table of one row: gender 1 must not reach row 0 silently
    with pytest.raises(
        ValueError,
        match=r"gender \(users.parquet column 'gender'\)': id 1 is out of range for table 'gender' of 1 rows",
    ):
        FeatureBuilder(dataclasses.replace(data, side_features=(small,)), 0).build(
            user_ids=np.arange(10),
            hist_lengths=np.zeros(10, dtype=np.int64),
            hist_items=np.zeros(0, dtype=np.int64),
            candidate_item_ids=np.zeros(0, dtype=np.int64),
        )


def test_declared_sizes_are_checked_against_the_column(ml_root, tmp_path):
    cfg, data = side_data(ml_root)
    copy = shutil.copytree(data.dir, tmp_path / "copy")
    meta = json.loads((copy / "meta.json").read_text())
    meta["user_features"]["age_bucket"] = 2
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        ValueError,
        match=r"model.features.age.column='age_bucket': .*users.parquet: column 'age_bucket' has id \d+ outside \[0, 2\) \(meta.json user_features.age_bucket = 2\)",
    ):
        with_side_features(load_dataset(copy), cfg.model.features)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.features.gender.column=gendr"], r"model.features.gender.column='gendr': .*no column 'gendr'"),
        (
            ["model.features.year.column=title"],
            r"model.features.year.column='title': .*column 'title' is (large_)?string, not integer ids",
        ),
        (
            ["model.features.age.table=gender"],
            r"model.features.age.table='gender': feature 'gender' already looks it up on the query tower",
        ),
        (["model.features.gender.table=category"], r"model.features.gender.table='category': a built-in table"),
    ],
)
def test_config_errors_that_need_the_data_name_key_and_value(ml_root, overrides, message):
    with pytest.raises(ValueError, match=message):
        side_data(ml_root, overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.features.gender.table=gendr"], r"model.features.gender.table='gendr': no such table in model.tables"),
        (
            ["model.features.gender.tower=candidate"],
            r"model.features.gender.tower='candidate': a users column can only feed the query tower",
        ),
        (["model.features.gender.source=user"], r"model.features.gender.source='user': expected 'users' or 'items'"),
        (
            ["data.history_length=0", "model.query_user_id=true"],
            r"model.features.history_year.tower='query': .*needs data.history_length > 0",
        ),
    ],
)
def test_config_typos_fail_at_start(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config([*SIDE, *overrides])


def fit_with_side_features(ml_root, run_dir, overrides=()):
    from recsys.job.run import fit

    cfg = tiny_config([*movielens_overrides(ml_root), *SIDE, *TRAIN, *overrides])
    return cfg, fit(cfg, run_dir)


def test_trains_evaluates_and_exports_with_side_features(ml_root, tmp_path, process_group):
    from recsys.export import ExportConfig, export_run
    from recsys.job.trained import load_trained
    from recsys.ranking.sharded import Evaluator, embed
    from recsys.serving.bundle import load_bundle

    run_dir = tmp_path / "run"
    cfg, results = fit_with_side_features(ml_root, run_dir)
    assert results["train"]["steps"] == 8 and 0.0 <= results["test"]["two_tower"]["recall@20"] <= 1.0

    data, _, sharded, _ = load_trained(cfg, run_dir, "", process_group)
    state = sharded.module.state_dict()
    tables = {k.split(".")[-2]: tuple(v.size()) for k, v in state.items() if ".embedding_bags." in k}
    # tiny: a profile bag and no user table; history_year looks up the year table, which has no twin
    assert tables == {
        "item": (150, 16),
        "category": (data.num_categories, 8),
        "neighbor": (150, 16),  # tiny's item neighbours (data.item_neighbors)
        "gender": (2, 4),
        "age": (7, 8),
        "occupation": (len(OCCUPATIONS_100K), 8),
        "year": (13, 8),
    }

    export_run(ExportConfig(run_dir=str(run_dir)))
    bundle = load_bundle(run_dir / "export")
    manifest = bundle.manifest
    assert [f["name"] for f in manifest["side_features"]] == ["gender", "age", "occupation", "history_year"]
    two_tower = sharded.two_tower.eval()
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, _, _, timeline = Evaluator(data, builder, ks=[20], batch_size=64, chunk_size=64).protocol("test")
    expected = embed(
        two_tower, builder, side="query", ids=users, timeline=timeline, batch_size=64, device=torch.device("cpu")
    )
    lengths, items = latest_items(timeline, users, data.num_users, cfg.data.history_length)
    served = bundle.encode_part("two_tower", users, lengths, items)
    np.testing.assert_allclose(served.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_two_ranks_train_with_side_features_and_one_rank_reads_their_checkpoint(ml_root, tmp_path, process_group):
    """2 ranks train and test (their side tables sharded table-wise); the checkpoint resharded onto this one
    process gives the same test metrics."""
    from recsys.evaluate import EvaluateConfig, evaluate_run

    run_dir = tmp_path / "run2"
    jobs = [{"fit": [*movielens_overrides(ml_root), *SIDE, *TRAIN, "sharding.device=cpu"], "run_dir": str(run_dir)}]
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    launch(["tests/helpers/run_jobs.py", str(tmp_path / "jobs.json")], nproc=2)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["train"]["world_size"] == 2 and results["train"]["steps"] == 8
    evaluate_run(
        EvaluateConfig(
            run_dir=str(run_dir),
            rankers=["graph_filter", "two_tower+graph_filter"],
            ann_kinds=[],
            ks=[10, 20, 50],
            out_dir=str(tmp_path / "eval"),
        )
    )
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    one_rank = report["splits"]["test"]["metrics"]["two_tower"]
    for name, value in results["test"]["two_tower"].items():
        assert value == pytest.approx(one_rank[name], rel=1e-9, abs=1e-12), name


def test_synthetic_user_groups_leave_everything_else_unchanged():
    spec = dataclasses.replace(TINY_SPEC, num_user_groups=4)
    interactions, items, users = generate(TINY_SPEC)
    grouped_interactions, grouped_items, grouped_users = generate(spec)
    assert grouped_interactions.equals(interactions) and grouped_items.equals(items)
    assert set(grouped_users["user_group"]) == {0, 1, 2, 3} and "user_group" not in users
    assert cache_key(spec, "recbole", 0) != cache_key(TINY_SPEC, "recbole", 0)


# ---------------------------------------------------------------- your own data: string side columns by configuration


def readme_experiment(conf_dir: Path) -> str:
    """docs/your-own-data.md "Side features"' experiment for your own side files, as
    conf_dir/experiment/my_shop.yaml: the override that adds conf_dir to Hydra's search path."""
    from tests.helpers.docs import DOCS, block_containing

    block = block_containing(DOCS / "your-own-data.md", "items_columns", lang="yaml")
    (conf_dir / "experiment").mkdir(parents=True)
    (conf_dir / "experiment" / "my_shop.yaml").write_text(block.text + "\n")
    return f"hydra.searchpath=[file://{conf_dir}]"


def test_string_side_columns_of_your_own_data_feed_the_towers(tmp_path, process_group):
    """A CSV log with string ids, items.csv (string brand, "|"-joined tags) and users.csv (string country),
    prepared by data=interactions and trained with model.features naming them: the documented experiment,
    its files replaced by the fixture's, and no other step."""
    from hydra import compose, initialize_config_dir

    from recsys.config import FeatureConfig, register_configs, to_config
    from recsys.job.run import fit
    from recsys.job.trained import load_trained
    from tests.data_pipelines.test_interactions import _log, write_side_files
    from tests.helpers.config import CONF_DIR

    log = _log()
    log.to_csv(tmp_path / "clicks.csv", index=False)
    items_csv, users_csv = write_side_files(tmp_path, log)
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        composed = compose(
            config_name="config",
            overrides=[
                readme_experiment(tmp_path / "conf"),
                "+experiment=my_shop",
                f"data.root={tmp_path / 'data'}",
                f"data.interactions.path={tmp_path / 'clicks.csv'}",
                f"data.interactions.items_path={items_csv}",
                f"data.interactions.users_path={users_csv}",
                "trainer.epochs=1",
                "trainer.max_steps_per_epoch=2",
                "trainer.global_batch_size=64",
                "trainer.progress_bar=false",
                "eval.batch_size=64",
            ],
        )
    cfg = to_config(composed)
    run_dir = tmp_path / "run"
    assert fit(cfg, run_dir)["train"]["steps"] == 2
    data, _, sharded, _ = load_trained(cfg, run_dir, "", process_group)

    # the mapping, from the raw files: distinct values ascending, a missing brand (""; the unlisted item) after them
    raw_items = pd.read_csv(items_csv, keep_default_na=False).set_index("item")
    raw_users = pd.read_csv(users_csv).set_index("user")
    brands = sorted({b.strip() for b in raw_items["brand"] if b.strip()})
    tags = sorted({t.strip() for ts in raw_items["tags"] for t in ts.split("|") if t.strip()})
    countries = sorted(set(raw_users["country"]))
    item_raw = pq.read_table(data.dir / "vocab/items.parquet").column("raw_id").to_pylist()
    user_raw = pq.read_table(data.dir / "vocab/users.parquet").column("raw_id").to_pylist()

    def brand_id(item):
        sku = item_raw[item]
        value = raw_items.loc[sku, "brand"].strip() if sku in raw_items.index else ""
        return brands.index(value) if value else len(brands)

    def tag_ids(item):
        sku = item_raw[item]
        values = raw_items.loc[sku, "tags"].split("|") if sku in raw_items.index else []
        return sorted({tags.index(t.strip()) for t in values if t.strip()})

    state = sharded.module.state_dict()
    rows = {k.split(".")[-2]: v.size(0) for k, v in state.items() if ".embedding_bags." in k}
    assert any(brand_id(i) == len(brands) for i in range(data.num_items))  # the fixture has missing brands
    assert {t: rows[t] for t in ("brand", "tags", "country")} == {
        "brand": len(brands) + 1,  # 3 brands + the missing one
        "tags": len(tags),  # a bag: no missing id (an empty bag)
        "country": len(countries),  # every user listed
    }

    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, hist_lengths, hist_items = np.array([0, 4, 7]), np.array([2, 0, 3]), np.array([1, 2, 3, 5, 39])
    candidates = np.arange(data.num_items)
    kjt = builder.build(
        user_ids=users, hist_lengths=hist_lengths, hist_items=hist_items, candidate_item_ids=candidates
    ).features.to_dict()
    assert kjt["country"].lengths().tolist() == [1, 1, 1] + [0] * len(candidates)
    assert kjt["country"].values().tolist() == [countries.index(raw_users.loc[user_raw[u], "country"]) for u in users]
    assert kjt["brand"].lengths().tolist() == [0, 0, 0] + [1] * len(candidates)
    assert kjt["brand"].values().tolist() == [brand_id(i) for i in candidates]
    # table tags: a query's row holds all its history items' tags (history_tags), a candidate's its own (tags)
    bags = [*np.split(hist_items, np.cumsum(hist_lengths)[:-1]), *([i] for i in candidates)]
    want_tags = [[t for i in bag for t in tag_ids(i)] for bag in bags]
    assert kjt["tags"].lengths().tolist() == [len(w) for w in want_tags]
    assert kjt["tags"].values().tolist() == [t for w in want_tags for t in w]

    # a float column is kept as it is, and is no feature: the message says how to make one
    with pytest.raises(
        ValueError, match=r"column 'price' is double, not integer ids .*data\.interactions\.items_columns"
    ):
        with_side_features(data, {"price": FeatureConfig(source="items", column="price", tower="candidate")})
