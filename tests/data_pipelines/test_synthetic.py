"""The synthetic generator: deterministic, exact counts (as in data_pipelines/README.md), planted signal."""

import dataclasses
import os

import numpy as np
import pandas as pd
import pytest

from data_pipelines.dataset_dir import read_meta
from data_pipelines.splits import split
from data_pipelines.synthetic import TINY_SPEC, SyntheticSpec, cache_key, generate, prepare_synthetic

# From data_pipelines/README.md: TINY_SPEC, protocol recbole, split seed 0.
TINY_RECBOLE_COUNTS = {"train": 15944, "valid": 2028, "test": 2028}


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_same_spec_gives_byte_identical_files(tmp_path):
    a = prepare_synthetic(TINY_SPEC, root=tmp_path / "a")
    b = prepare_synthetic(TINY_SPEC, root=tmp_path / "b")
    assert a.name == b.name
    assert _snapshot(a) == _snapshot(b)
    assert set(_snapshot(a)) == {
        "meta.json",
        "train.parquet",
        "valid.parquet",
        "test.parquet",
        "items.parquet",
        "users.parquet",
    }


def test_different_seeds_give_different_data():
    base, _, _ = generate(TINY_SPEC)
    other, _, _ = generate(dataclasses.replace(TINY_SPEC, seed=1))
    assert not base[["user_id", "item_id"]].equals(other[["user_id", "item_id"]])
    test0 = split(base, "recbole", seed=0)[2]
    test1 = split(base, "recbole", seed=1)[2]
    assert len(test0) == len(test1) and not test0.equals(test1)


def test_tiny_counts_match_readme(tmp_path):
    out = prepare_synthetic(TINY_SPEC, protocol="recbole", split_seed=0, root=tmp_path)
    meta = read_meta(out)
    assert meta["counts"] == TINY_RECBOLE_COUNTS
    assert (meta["num_users"], meta["num_items"], meta["num_categories"]) == (400, 300, 8)
    assert meta["name"] == "synthetic" and meta["protocol"] == "recbole" and meta["seed"] == 0
    assert meta["sources"] == [] and meta["spec"] == dataclasses.asdict(TINY_SPEC)
    assert meta["cache_key"] == cache_key(TINY_SPEC, "recbole", 0) and out.name == f"synthetic-{meta['cache_key']}"
    for s, n in TINY_RECBOLE_COUNTS.items():
        assert len(pd.read_parquet(out / f"{s}.parquet")) == n


def test_generated_invariants():
    spec = TINY_SPEC
    inter, items, users = generate(spec)
    assert len(inter) == spec.num_interactions
    assert list(inter.columns) == ["user_id", "item_id", "timestamp", "rating"]
    assert [str(t) for t in inter.dtypes] == ["int64", "int64", "int64", "float32"]
    assert not inter.duplicated(["user_id", "item_id"]).any()
    per_user = inter.groupby("user_id").size()
    assert len(per_user) == spec.num_users
    assert per_user.min() >= spec.min_interactions_per_user and per_user.max() <= spec.num_items // 2
    assert per_user.max() > 3 * per_user.median(), "activity should be heavy-tailed"
    assert (inter.groupby("user_id").timestamp.diff().dropna() > 0).all(), "timestamps strictly increase per user"
    assert inter.timestamp.min() >= spec.start_timestamp
    assert set(inter.rating.unique()) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert items.item_id.tolist() == list(range(spec.num_items)) and users.user_id.tolist() == list(
        range(spec.num_users)
    )
    for cats in items.categories:
        assert (
            1 <= len(cats) <= 3
            and list(cats) == sorted(set(cats))
            and 0 <= min(cats)
            and max(cats) < spec.num_categories
        )


def _recall_at_k(scores, train, test, k=20):
    """Mean over test users of |top-k \\ train ∩ test| / |test|."""
    scores = np.array(scores, dtype=np.float64)
    scores[train.user_id.to_numpy(), train.item_id.to_numpy()] = -np.inf
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    relevant = np.zeros(scores.shape, dtype=bool)
    relevant[test.user_id.to_numpy(), test.item_id.to_numpy()] = True
    hits = np.take_along_axis(relevant, top, axis=1).sum(axis=1)
    n_relevant = relevant.sum(axis=1)
    return float((hits[n_relevant > 0] / n_relevant[n_relevant > 0]).mean())


def test_planted_structure_beats_popularity():
    inter, _, _, factors = generate(TINY_SPEC, return_factors=True)
    train, _, test = split(inter, "recbole", seed=0)
    shape = (TINY_SPEC.num_users, TINY_SPEC.num_items)
    popularity = np.broadcast_to(np.bincount(train.item_id, minlength=TINY_SPEC.num_items), shape)
    pop = _recall_at_k(popularity, train, test)
    oracle = _recall_at_k(factors.logits(), train, test)
    affinity_only = _recall_at_k(factors.user_factors @ factors.item_factors.T, train, test)
    random = _recall_at_k(np.random.default_rng(0).random(shape), train, test)
    assert oracle > 3 * pop, (oracle, pop)  # measured: 0.84 vs 0.20
    assert affinity_only > 2 * pop, (affinity_only, pop)  # U.V alone, no popularity term
    assert pop > 2 * random, (pop, random)  # popularity is a real (if weak) signal: 0.20 vs 0.07
    counts = np.sort(np.bincount(inter.item_id, minlength=TINY_SPEC.num_items))[::-1]
    assert counts[:5].sum() < 0.1 * len(inter), "popularity must not collapse onto a few items"


def test_counts_are_exact_for_odd_sizes():
    spec = SyntheticSpec(num_users=37, num_items=80, num_categories=3, num_interactions=997, seed=5)
    inter, items, _ = generate(spec)
    assert len(inter) == 997 and inter.user_id.nunique() == 37 and not inter.duplicated(["user_id", "item_id"]).any()


def test_spec_rejects_impossible_counts():
    with pytest.raises(ValueError, match="num_interactions"):
        SyntheticSpec(num_users=10, num_items=10, num_categories=2, num_interactions=1000)


def test_prepare_is_idempotent(tmp_path):
    first = prepare_synthetic(TINY_SPEC, root=tmp_path)
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    os.utime(first / "meta.json", ns=(1, 1))  # an old mtime: any rewrite would change it
    mtimes["meta.json"] = 1
    second = prepare_synthetic(TINY_SPEC, root=tmp_path)
    assert second == first and second.is_absolute()
    assert {p.name: p.stat().st_mtime_ns for p in second.iterdir()} == mtimes
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_prepare_keys_by_protocol_and_seed(tmp_path):
    recbole = prepare_synthetic(TINY_SPEC, protocol="recbole", root=tmp_path)
    loo = prepare_synthetic(TINY_SPEC, protocol="loo", root=tmp_path)
    reseeded = prepare_synthetic(TINY_SPEC, protocol="recbole", split_seed=1, root=tmp_path)
    assert len({recbole, loo, reseeded}) == 3
    assert read_meta(loo)["counts"] == {"train": 19200, "valid": 400, "test": 400}
    with pytest.raises(ValueError, match="unknown split protocol"):
        prepare_synthetic(TINY_SPEC, protocol="nope", root=tmp_path)


def test_prepare_rewrites_an_incomplete_dir(tmp_path):
    out = prepare_synthetic(TINY_SPEC, root=tmp_path)
    (out / "test.parquet").unlink()
    assert prepare_synthetic(TINY_SPEC, root=tmp_path) == out
    assert len(pd.read_parquet(out / "test.parquet")) == TINY_RECBOLE_COUNTS["test"]
