"""The plain two-tower baseline (recsys/rankers/plain_two_tower/): its loss, its snapshots, that it learns planted
structure, and that it is a ranker like any other (tuned on valid, fit again on train + valid, refused bad settings)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from data_pipelines.errors import ConfigError
from recsys.job.ranker_choice import check_rankers
from recsys.job.run import fit
from recsys.rankers.plain_two_tower.model import _in_batch_softmax, train_plain_two_tower
from recsys.ranking.retrieval import exact_topk, popularity_topk
from tests.helpers.config import tiny_config
from tests.rankers.test_ials import NUM_ITEMS, NUM_USERS, _planted_case, _recall


def test_the_loss_is_the_softmax_over_the_batch_logq_corrected_with_repeats_of_the_row_item_masked():
    gen = torch.Generator().manual_seed(0)
    u, i = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    distinct = torch.arange(6)
    reference = F.cross_entropy(F.normalize(u, dim=1) @ F.normalize(i, dim=1).t() / 0.2, distinct)
    assert _in_batch_softmax(u, i, distinct, 0.2).item() == pytest.approx(reference.item(), rel=1e-6)
    # logQ: each column's item's log sampling probability comes off every row's logit
    log_q = torch.log(torch.tensor([0.4, 0.1, 0.1, 0.2, 0.1, 0.1]))
    logits = F.normalize(u, dim=1) @ F.normalize(i, dim=1).t() / 0.2 - log_q[None, :]
    corrected = _in_batch_softmax(u, i, distinct, 0.2, log_q).item()
    assert corrected == pytest.approx(F.cross_entropy(logits, distinct).item(), rel=1e-6)
    assert corrected != pytest.approx(reference.item(), rel=1e-3)
    # every row the same item: no row has a negative left, so nothing to push down
    assert _in_batch_softmax(u, i, torch.zeros(6, dtype=torch.int64), 0.2).item() == pytest.approx(0.0, abs=1e-6)


def test_the_tables_after_an_epoch_are_those_of_a_training_that_stops_there():
    train, _ = _planted_case()
    long = train_plain_two_tower(train, dim=8, temperature=0.2, lr=0.01, epochs=[2, 4], batch_size=64, seed=3)
    short = train_plain_two_tower(train, dim=8, temperature=0.2, lr=0.01, epochs=[2], batch_size=64, seed=3)
    other = train_plain_two_tower(train, dim=8, temperature=0.2, lr=0.01, epochs=[2], batch_size=64, seed=4)
    assert sorted(long) == [2, 4] and list(short) == [2]
    for a, b in zip(long[2], short[2], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(long[2][1], long[4][1]) and not torch.allclose(short[2][1], other[2][1])
    assert torch.linalg.vector_norm(long[4][0], dim=1) == pytest.approx(torch.ones(NUM_USERS), abs=1e-5)


def test_it_finds_planted_groups_that_popularity_cannot():
    train, valid = _planted_case()
    users, items = train_plain_two_tower(train, dim=16, temperature=0.2, lr=0.01, epochs=[30], batch_size=128)[30]
    ids = exact_topk(users, items, 10, exclude=train)[1]
    counts = torch.from_numpy(np.bincount(train.indices, minlength=NUM_ITEMS))
    pop = _recall(popularity_topk(counts, NUM_USERS, 10, exclude=train)[1], valid, 10)
    plain = _recall(ids, valid, 10)
    # 10 slots for the ~9 unseen items of the user's group (iALS: 0.79 on the same case), popularity about a fifth
    assert plain > 0.6 and pop < 0.25, (plain, pop)


def test_a_run_ranks_it_tuned_on_valid_and_fit_again_on_train_and_valid(tmp_path, data_root, process_group):
    grid = [
        "eval.settings.plain_two_tower.dims=[8]",
        "eval.settings.plain_two_tower.temperatures=[0.1,0.5]",
        "eval.settings.plain_two_tower.learning_rates=[0.01]",
        "eval.settings.plain_two_tower.epochs=[1,3]",
    ]
    cfg = tiny_config(
        [f"data.root={data_root}", "trainer.epochs=1", "eval.rankers=[two_tower,popularity,plain_two_tower]", *grid]
    )
    fit(cfg, tmp_path / "run")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    row = results["rankers"]["plain_two_tower"]
    assert row["fit_on"] == {"valid": "train", "test": "train + valid"}
    assert row["tuned_on"].startswith("valid recall@20") and len(row["grid"]) == 4
    best = max(row["grid"], key=row["grid"].get)  # test is ranked at valid's best point
    assert {k: float(v) for k, v in (kv.split("=") for kv in best.split(","))} == {
        k: float(v) for k, v in row["point"].items()
    }
    assert results["valid"]["plain_two_tower"]["recall@20"] == pytest.approx(max(row["grid"].values()), abs=1e-6)
    assert 0 < results["test"]["plain_two_tower"]["recall@20"] <= 1


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("eval.settings.plain_two_tower.temperatures=[0.0]", "eval.settings.plain_two_tower.temperatures"),
        ("eval.settings.plain_two_tower.epochs=[]", "eval.settings.plain_two_tower.epochs"),
        ("eval.settings.plain_two_tower.batch_size=1", "eval.settings.plain_two_tower.batch_size"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(override, key):
    cfg = tiny_config(["eval.rankers=[two_tower,plain_two_tower]", override])
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_rankers(cfg)
