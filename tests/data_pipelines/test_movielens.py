"""MovieLens pipelines on generated files in each release's real format (never a download).

Expected counts on ``tests.helpers.movielens.hand_ratings()`` (6 users, n_u good ratings + one
1-2 star rating of movie 21 each; see data_pipelines/README.md "Expected counts"):

- recbole (rating >= 3): n_u = 10, 3, 4, 2, 20, 5 -> 8/1/1, 1/1/1, 2/1/1, 2/0/0, 16/2/2, 3/1/1
  = 32 / 6 / 6; movie 21 goes, movie 22 was never rated: 20 items.
- loo (every rating): n_u + 1 rows, all >= 3 -> 1 valid + 1 test each: 38 / 6 / 6, 21 items.
- strong_generalization (rating >= 4, users >= 5 items, 1 + 1 held-out users): users 1, 5, 6
  qualify; seed 0 keeps user 6 (movies 1..5) for training, so held-out users 1 and 5 keep
  movies 1..5 only: floor(0.2 * 5) = 1 target each -> 5 + 4 + 4 = 13 / 1 / 1, 5 items.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from data_pipelines.dataset_dir import read_meta
from data_pipelines.movielens import RELEASES, MovieLensError, prepare_movielens
from tests.helpers.launch import launch
from tests.helpers.movielens import random_ratings, release_files, write_folder, write_zip

PROTOCOLS = {  # protocol -> (filters as in conf/data/protocol/*.yaml, expected train/valid/test, users, items)
    "recbole": (dict(min_rating=3.0), (32, 6, 6), 6, 20),
    "loo": (dict(), (38, 6, 6), 6, 21),
    "strong_generalization": (dict(min_rating=4.0, min_user_interactions=5), (13, 1, 1), 3, 5),
}


def _prepare(root, release="ml-100k", protocol="recbole", **kw):
    options = {**PROTOCOLS[protocol][0], **kw}
    return prepare_movielens(release, root=root, protocol=protocol, progress=False, allow_download=False, **options)


def _counts(path):
    meta = read_meta(path)
    return tuple(meta["counts"][s] for s in ("train", "valid", "test")), meta["num_users"], meta["num_items"]


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_release_format_from_folder(tmp_path, release):
    write_folder(tmp_path, release)
    path = _prepare(tmp_path, release)
    assert _counts(path) == ((32, 6, 6), 6, 20)
    meta = read_meta(path)
    assert meta["release"] == release and meta["protocol"] == "recbole" and meta["num_categories"] == 6
    assert [s["file"] for s in meta["sources"]][0].startswith(RELEASES[release].folders[0] + "/")
    items = pd.read_parquet(path / "items.parquet")
    vocab = pd.read_parquet(path / "vocab/items.parquet")
    assert vocab.raw_id.tolist() == list(range(1, 21))
    assert vocab.title[0] == "Misérables, Les (1995)" and vocab.title[1] == "Café au lait (Gazon maudit) (1995)"
    assert vocab.title[2] == "American President, The (1995)"  # quoted comma in the CSV releases
    categories = pd.read_parquet(path / "vocab/categories.parquet").name.tolist()
    assert categories == sorted(categories) and "(no genres listed)" in categories
    assert items.categories[2].tolist() == [categories.index("(no genres listed)")]
    assert items.year[:7].tolist() == [1995, 1995, 1995, 0, 1927, 2001, 2020]
    assert items.year_bucket[:7].tolist() == [9, 9, 9, 0, 2, 10, 12]
    users = pd.read_parquet(path / "users.parquet")
    assert pd.read_parquet(path / "vocab/users.parquet").raw_id.tolist() == [1, 2, 3, 4, 5, 6]
    if RELEASES[release].users:
        assert set(users.columns) == {"user_id", "gender", "age_bucket", "occupation"}
        assert users.gender.tolist() == [0, 1, 0, 1, 0, 1]  # fixture: odd users F (0)
    else:
        assert users.columns.tolist() == ["user_id"]


def test_ml100k_user_features(tmp_path):
    write_folder(tmp_path, "ml-100k")
    users = pd.read_parquet(_prepare(tmp_path) / "users.parquet")
    # ages 24, 31, 38, 45, 52, 59 -> buckets 18-24, 25-34, 35-44, 45-49, 50-55, 56+
    assert users.age_bucket.tolist() == [1, 2, 3, 4, 5, 6]
    names = pd.read_parquet(_prepare(tmp_path).joinpath("vocab/occupations.parquet")).name.tolist()
    assert [names[o] for o in users.occupation] == [
        "writer",
        "other",
        "student",
        "educator",
        "programmer",
        "technician",
    ]


@pytest.mark.parametrize("release", ["ml-1m", "ml-25m"])
def test_zip_gives_the_same_tables_as_the_folder(tmp_path, release):
    write_folder(tmp_path / "a", release)
    write_zip(tmp_path / "b", release)
    a, b = _prepare(tmp_path / "a", release), _prepare(tmp_path / "b", release)
    for f in (
        "train.parquet",
        "valid.parquet",
        "test.parquet",
        "items.parquet",
        "users.parquet",
        "vocab/items.parquet",
    ):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert read_meta(b)["sources"][0]["file"] == f"{release}.zip"


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_protocol_counts_by_hand(tmp_path, protocol):
    write_folder(tmp_path, "ml-1m")
    path = _prepare(tmp_path, "ml-1m", protocol)
    _, splits, num_users, num_items = PROTOCOLS[protocol]
    assert _counts(path) == (splits, num_users, num_items)
    assert read_meta(path)["protocol"] == protocol


def test_strong_generalization_layout(tmp_path):
    write_folder(tmp_path, "ml-1m")
    path = _prepare(tmp_path, "ml-1m", "strong_generalization")
    heldout = pd.read_parquet(path / "heldout_users.parquet")
    train, valid, test = (pd.read_parquet(path / f"{s}.parquet") for s in ("train", "valid", "test"))
    raw = pd.read_parquet(path / "vocab/users.parquet").raw_id.tolist()
    assert [raw[u] for u in heldout.user_id] == [1, 5] and heldout.split.tolist() == ["valid", "test"]
    assert set(valid.user_id) == {heldout.user_id[0]} and set(test.user_id) == {heldout.user_id[1]}
    for u in heldout.user_id:  # 4 fold-in rows in train, disjoint from the user's target
        targets = pd.concat([valid, test])
        fold_in = set(train.item_id[train.user_id == u])
        assert len(fold_in) == 4 and not fold_in & set(targets.item_id[targets.user_id == u])
    meta = read_meta(path)
    assert meta["strong_generalization"]["num_valid_users"] == 1 and meta["filters"]["min_rating"] == 4.0


def test_same_seed_gives_byte_identical_parquet_and_reuses_the_dir(tmp_path):
    write_folder(tmp_path / "a", "ml-20m")
    write_folder(tmp_path / "b", "ml-20m")
    a, b = _prepare(tmp_path / "a", "ml-20m"), _prepare(tmp_path / "b", "ml-20m")
    assert a.name == b.name
    files = sorted(p.relative_to(a) for p in a.rglob("*.parquet"))
    assert len(files) == 8
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    mtime = (a / "meta.json").stat().st_mtime_ns
    assert _prepare(tmp_path / "a", "ml-20m") == a and (a / "meta.json").stat().st_mtime_ns == mtime
    c = prepare_movielens("ml-20m", root=tmp_path / "a", seed=1, min_rating=3.0, progress=False)
    assert c != a and _counts(c) == _counts(a)
    assert (c / "test.parquet").read_bytes() != (a / "test.parquet").read_bytes()


def _bad(files: dict[str, bytes], name: str, old: bytes, new: bytes) -> dict[str, bytes]:
    assert old in files[name], (name, old)
    return {**files, name: files[name].replace(old, new, 1)}


def _first_lines(data: bytes, n: int) -> bytes:
    return b"".join(data.splitlines(keepends=True)[:n])


BAD_INPUTS = {
    # id: (release, mutate(files) -> files, regex naming file, line and field)
    "wrong separator": (
        "ml-1m",
        lambda f: {**f, "ratings.dat": f["ratings.dat"].replace(b"::", b"\t")},
        r"ratings\.dat line 1: expected 4 fields .* separated by '::', got 1",
    ),
    "missing column": (
        "ml-25m",
        lambda f: {
            **f,
            "ratings.csv": f["ratings.csv"].replace(b"userId,movieId,rating,timestamp", b"userId,movieId,timestamp"),
        },
        r"ratings\.csv line 1: missing column\(s\) \['rating'\]",
    ),
    "non-numeric rating": (
        "ml-100k",
        lambda f: _bad(f, "u.data", b"1\t3\t4\t", b"1\t3\tfive\t"),
        r"u\.data line 3, field 'rating': 'five' is not a number",
    ),
    "NaN rating": (
        "ml-20m",
        lambda f: _bad(f, "ratings.csv", b"1,2,5.0,", b"1,2,NaN,"),
        r"ratings\.csv line 3, field 'rating': 'NaN' is not a finite number",
    ),
    "negative rating": (
        "ml-100k",
        lambda f: _bad(f, "u.data", b"1\t3\t4\t", b"1\t3\t-3\t"),
        r"u\.data line 3, field 'rating': '-3' is outside \[0\.5, 5\.0\]",
    ),
    "rating above 5": (
        "ml-25m",
        lambda f: _bad(f, "ratings.csv", b"1,2,5.0,", b"1,2,50,"),
        r"ratings\.csv line 3, field 'rating': '50' is outside \[0\.5, 5\.0\]",
    ),
    "non-integer user id": (
        "ml-10m",
        lambda f: _bad(f, "ratings.dat", b"\n2::1::", b"\n2.5::1::"),
        r"ratings\.dat line 12, field 'user id': '2\.5' is not an integer",
    ),
    "non-integer movie id": (
        "ml-latest-small",
        lambda f: _bad(f, "movies.csv", b"\n5,", b"\nfive,"),
        r"movies\.csv line 6, field 'movie id': 'five' is not an integer",
    ),
    "empty ratings": ("ml-1m", lambda f: {**f, "ratings.dat": b""}, r"ratings\.dat: empty file"),
    "empty csv": (
        "ml-25m",
        lambda f: {**f, "ratings.csv": b"userId,movieId,rating,timestamp\n"},
        r"ratings\.csv: empty file",
    ),
    "bad genre flag": (
        "ml-100k",
        lambda f: _bad(f, "u.item", b"|0|", b"|x|"),
        r"u\.item line 1, field '.*': genre flag 'x'",
    ),
    "unquoted comma title": (
        "ml-20m",
        lambda f: _bad(f, "movies.csv", b'"American President, The (1995)"', b"American President, The (1995)"),
        r"movies\.csv line 4: expected 3 fields .* got 4 \(a title with a comma must be quoted\)",
    ),
    "unknown movie": (
        "ml-1m",
        lambda f: {**f, "movies.dat": _first_lines(f["movies.dat"], 15)},
        r"ratings\.dat: movie id\(s\) \[16, 17, 18, 19, 20\] .* have no row in .*movies\.dat",
    ),
    "bad gender": (
        "ml-1m",
        lambda f: _bad(f, "users.dat", b"2::M::", b"2::X::"),
        r"users\.dat line 2, field 'gender': 'X'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_file_line_field_and_keeps_earlier_output(tmp_path, case):
    release, mutate, pattern = BAD_INPUTS[case]
    folder = write_folder(tmp_path, release)
    good = _prepare(tmp_path, release)
    before = {p: p.read_bytes() for p in good.rglob("*") if p.is_file()}
    for name, data in mutate(release_files(release)).items():
        (folder / name).write_bytes(data)
    with pytest.raises(MovieLensError, match=pattern):
        _prepare(tmp_path, release)
    assert {p: p.read_bytes() for p in good.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, good.name])  # no temporary dirs


def test_truncated_zip_is_named(tmp_path):
    data = write_zip(tmp_path, "ml-1m").read_bytes()
    (tmp_path / "ml-1m.zip").write_bytes(data[: len(data) // 2])
    with pytest.raises(MovieLensError, match=r"ml-1m\.zip: not a readable zip .*truncated or corrupt"):
        _prepare(tmp_path, "ml-1m")


def test_corrupt_zip_member_is_named(tmp_path):
    path = write_zip(tmp_path, "ml-1m")
    data = bytearray(path.read_bytes())
    start = data.find(b"ratings.dat") + len(b"ratings.dat") + 5  # inside the deflated ratings member
    data[start : start + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(MovieLensError, match=r"ml-1m\.zip:ml-1m/ratings\.dat: corrupt zip member"):
        _prepare(tmp_path, "ml-1m")


def test_protocol_leaving_a_split_empty_is_an_error(tmp_path):
    two_each = [(u, i, 4.0, 1000 * u + i) for u in (1, 2) for i in (1, 2)]  # < 3 rows per user: all train
    write_folder(tmp_path, "ml-1m", release_files("ml-1m", two_each))
    with pytest.raises(MovieLensError, match=r"protocol loo .* leaves the valid split empty \(\[4, 0, 0\]"):
        _prepare(tmp_path, "ml-1m", "loo")
    with pytest.raises(MovieLensError, match=r"no ratings left after the filters"):
        _prepare(tmp_path, "ml-1m", min_rating=5.5)
    assert [p.name for p in tmp_path.iterdir()] == ["ml-1m"]


def test_no_copy_and_no_download_says_where_to_put_the_file(tmp_path):
    with pytest.raises(
        MovieLensError,
        match=rf"put ml-1m\.zip \(from https://files\.grouplens\.org/datasets/movielens/ml-1m\.zip\) or its extracted folder ml-1m/ .* in {tmp_path}",
    ):
        _prepare(tmp_path, "ml-1m")


def test_cli_without_network_exits_nonzero_with_one_message(tmp_path):
    result = launch(
        [
            "-m",
            "data_pipelines.prepare",
            "data=movielens_1m",
            f"data.root={tmp_path}",
            "data.movielens.url=http://127.0.0.1:9/ml-1m.zip",
            "hydra.run.dir=" + str(tmp_path / "run"),
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ],
        check=False,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: cannot download http://127.0.0.1:9/ml-1m.zip")
    assert "put ml-1m.zip (from https://files.grouplens.org/datasets/movielens/ml-1m.zip)" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("*.zip*"))


def test_fit_trains_on_an_ml100k_format_fixture(tmp_path, process_group):
    from recsys.job.run import fit
    from tests.helpers.config import tiny_config

    files = release_files("ml-100k", random_ratings(120, 150, seed=0), num_movies=150, num_users=120)
    write_folder(tmp_path / "data", "ml-100k", files)
    cfg = tiny_config(
        [
            "data=movielens_100k",
            f"data.root={tmp_path / 'data'}",
            "data.movielens.download=false",
            "trainer.epochs=1",
            "trainer.max_steps_per_epoch=3",
            "trainer.global_batch_size=64",
        ]
    )
    results = fit(cfg, tmp_path / "run")
    assert results["dataset"]["name"] == "movielens_100k" and results["train"]["steps"] == 3
    assert results["dataset"]["counts"]["users"] == 120
    assert 0.0 <= results["test"]["two_tower"]["recall@20"] <= 1.0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["dataset"]["protocol"] == "recbole"


def test_fit_strong_generalization_trains_on_training_users_only(tmp_path, process_group):
    from recsys.data.dataset import load_dataset
    from recsys.job.run import fit
    from tests.helpers.config import tiny_config

    files = release_files("ml-100k", random_ratings(120, 150, seed=0), num_movies=150, num_users=120)
    write_folder(tmp_path / "data", "ml-100k", files)
    cfg = tiny_config(
        [
            "data=movielens_100k",
            "data/protocol=strong_generalization",
            f"data.root={tmp_path / 'data'}",
            "data.movielens.download=false",
            "data.num_heldout_users=10",
            "trainer.epochs=1",
            "trainer.global_batch_size=64",
            "eval.ks=[20,100]",
            "eval.valid_metric=recall_liang@20",
        ]
    )
    results = fit(cfg, tmp_path / "run")
    data = load_dataset(results["dataset"]["dir"])
    assert len(data.heldout_users) == 20 and results["dataset"]["protocol"] == "strong_generalization"
    examples = int((~data.is_heldout(data.splits["train"].user_ids)).sum())
    assert results["train"]["samples"] == examples  # one epoch: every training user's row once, no fold-in row
    assert set(results["test"]["two_tower"]) >= {"recall_liang@20", "ndcg@100"}
