"""trainer.refit: after selection on valid, a fresh model trained on train + valid for the selected
number of epochs, tested, and readable like any run (offline report); data.train_on_valid alone."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from data_pipelines.prepare import prepare_dataset
from recsys.config import check_values
from recsys.data.neighbors import with_item_neighbors
from recsys.distributed.rank_data import load_rank_data
from recsys.evaluate import EvaluateConfig, evaluate_run
from recsys.job.assemble import open_dataset
from recsys.job.trained import REFIT_DIR
from recsys.rankers.registry import DEFAULT_FUSION as FUSED_MODEL
from recsys.rankers.registry import EASE_FUSION
from tests.data.test_no_categories import fit_given_split
from tests.helpers.config import tiny_config


@pytest.fixture(scope="module")
def refit_run(tmp_path_factory, process_group):
    return fit_given_split(
        tmp_path_factory.mktemp("refit"),
        # null: the rule refits a training split this small (recsys/job/refit_rule.py)
        ["trainer.refit=null", "data.item_neighbors=4", "eval.settings.graph_filter.alphas=[0.1,0.2]"],
    )


def test_refit_trains_on_train_and_valid_for_the_selected_epochs(refit_run):
    cfg, run_dir, results = refit_run
    refit = results["refit"]
    assert json.loads((run_dir / "results.json").read_text())["refit"] == refit
    assert json.loads((run_dir / REFIT_DIR / "results.json").read_text()) == refit
    counts = results["dataset"]["counts"]
    assert counts["valid"] > 0
    assert refit["dataset"]["counts"]["train"] == counts["train"] + counts["valid"]
    assert refit["dataset"]["counts"]["valid"] == 0 and refit["valid"] == {}
    # one step per 128 examples (trainer.global_batch_size=128), best epoch + 1 epochs
    steps_per_epoch = -(-(counts["train"] + counts["valid"]) // 128)
    assert refit["train"]["steps"] == (results["train"]["best_epoch"] + 1) * steps_per_epoch
    assert refit["train"]["best_epoch"] == results["train"]["best_epoch"]  # the last epoch's weights are tested
    test = refit["test"]
    assert test["two_tower"]["recall@20"] > 1.5 * test["popularity"]["recall@20"]


def test_the_fusion_is_chosen_on_valid_and_given_to_the_refit(refit_run):
    """data.item_neighbors > 0 adds the two-tower fused with the graph filter (and, on this small catalogue, with
    EASE): its alpha, sharpening and beta are chosen on the selection stage's valid (beta = 0, the two-tower alone, is
    in the grid), the refit ranks test at that point and serves what the selection stage served, and results.json
    says what each row was fit on, what tuned it and whether the bundle serves it."""
    _, _, results = refit_run
    chosen = results["rankers"][FUSED_MODEL]
    # beta = 0 once, then alpha x sharpen x beta
    assert chosen["tuned_on"].startswith("valid recall@20") and len(chosen["grid"]) == 1 + 2 * 1 * 3
    fused_valid = results["valid"][FUSED_MODEL]["recall@20"]
    assert fused_valid == pytest.approx(max(chosen["grid"].values()))
    assert fused_valid >= chosen["grid"]["alpha=0.1,sharpen=2.5,beta=0"] - 1e-9
    assert chosen["grid"]["alpha=0.1,sharpen=2.5,beta=0"] == pytest.approx(
        results["valid"]["two_tower"]["recall@20"], abs=1e-9
    )
    assert chosen["fit_on"] == {"valid": "train", "test": "train + valid"} and chosen["servable"]
    assert results["rankers"]["popularity"]["servable"] is False
    # served: the servable ranker best on valid (the later listed on a tie), and the refit serves the same one
    servable = [name for name, row in results["rankers"].items() if row["servable"]]
    assert set(servable) == {"two_tower", FUSED_MODEL, EASE_FUSION}
    best = max(results["valid"][name]["recall@20"] for name in servable)
    served = results["headline"]["ranker"]
    assert results["valid"][served]["recall@20"] == best and results["headline"]["test"] == results["test"][served]
    assert served != "two_tower" or best > results["valid"][FUSED_MODEL]["recall@20"]
    refit = results["refit"]
    assert refit["headline"]["ranker"] == served
    assert refit["rankers"][FUSED_MODEL]["point"] == chosen["point"]
    assert refit["rankers"][FUSED_MODEL]["tuned_on"] == "given"
    assert refit["rankers"][FUSED_MODEL]["fit_on"] == {"test": "train + valid"}
    assert {"two_tower", "popularity", FUSED_MODEL, EASE_FUSION} == set(refit["test"]) == set(results["test"])


def test_the_refit_run_dir_reads_back_with_its_merged_data(refit_run):
    """The offline report of <run>/refit rebuilds the same data (valid in train, its neighbours) and
    reproduces the refit's test recall from its checkpoint."""
    _, run_dir, results = refit_run
    evaluate_run(
        EvaluateConfig(
            run_dir=str(run_dir / REFIT_DIR),
            ann_kinds=["flat"],
            ks=[20],
            rankers=["graph_filter", "two_tower+graph_filter"],
        )
    )
    saved = json.loads((run_dir / REFIT_DIR / "eval" / "report.json").read_text())
    expected = results["refit"]["test"]["two_tower"]["recall@20"]
    assert saved["splits"]["test"]["metrics"][saved["model"]]["recall@20"] == pytest.approx(expected, abs=1e-6)


def test_valid_rows_join_train_for_every_reader(refit_run, process_group):
    cfg, _, _ = refit_run
    root = prepare_dataset(cfg.data)
    plain = open_dataset(cfg, root)
    whole = open_dataset(replace(cfg, data=replace(cfg.data, train_on_valid=True)), root)
    train, valid = plain.splits["train"], plain.splits["valid"]
    assert len(whole.splits["valid"]) == 0 and len(whole.splits["train"]) == len(train) + len(valid)
    assert np.array_equal(
        whole.item_counts(), np.bincount(np.concatenate([train.item_ids, valid.item_ids]), minlength=plain.num_items)
    )
    # a rank reading its own users (data.shard_by_user) merges too, and builds the same neighbours
    ranked, example_counts = load_rank_data(root, process_group, valid_in_train=True)
    ranked = with_item_neighbors(ranked, cfg.data.item_neighbors)
    assert example_counts == [len(whole.splits["train"])]
    assert np.array_equal(ranked.global_item_counts, whole.item_counts())
    assert np.array_equal(ranked.item_neighbor_ids, whole.item_neighbor_ids)
    assert np.array_equal(ranked.item_neighbor_indptr, whole.item_neighbor_indptr)
    assert not np.array_equal(whole.item_neighbor_ids, plain.item_neighbor_ids)  # valid's co-occurrences count


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.refit=true", "data.train_on_valid=true"], "trainer.refit=True: the refit is the second stage"),
        (["trainer.refit=true", "data.protocol=strong_generalization"], "nothing to refit on"),
    ],
)
def test_refit_refuses_what_it_cannot_do(overrides, message):
    with pytest.raises(ValueError, match=message):
        check_values(tiny_config(overrides))


def test_export_of_a_refit_run_bundles_the_refit_and_says_how_to_export_the_selection(refit_run, tmp_path, caplog):
    """The run dir exports the refit (train + valid: the figures results.json answers with), saying so and how to
    export the selection stage (stage=selection, train only); each bundle's manifest says which."""
    import logging

    from recsys.export import ExportConfig, export_run

    _, run_dir, _ = refit_run
    with caplog.at_level(logging.INFO, logger="recsys.job.checks"):
        refit = export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(tmp_path / "refit")))
        selection = export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(tmp_path / "sel"), stage="selection"))
        also = export_run(ExportConfig(run_dir=str(run_dir / REFIT_DIR), out_dir=str(tmp_path / "also")))
    said = [r.getMessage() for r in caplog.records if r.name == "recsys.job.checks"]
    assert said == [
        f'{run_dir}: exporting the refit {run_dir / REFIT_DIR} (trained on train + valid: results.json\'s "refit" '
        "figures); stage=selection exports the selection stage (train only)",
        f"{run_dir}: exporting the selection stage (trained on train only; checkpoints/best), as stage=selection asks",
        f"{run_dir / REFIT_DIR}: exporting the refit (trained on train + valid); run_dir={run_dir} stage=selection "
        "exports the selection stage (train only)",
    ]
    assert json.loads((refit / "manifest.json").read_text())["trained_on"] == "train + valid"
    assert json.loads((also / "manifest.json").read_text())["trained_on"] == "train + valid"
    assert json.loads((selection / "manifest.json").read_text())["trained_on"] == "train"
    with pytest.raises(ValueError, match="stage='refit': expected one of auto, selection"):
        export_run(ExportConfig(run_dir=str(run_dir), out_dir=str(tmp_path / "bad"), stage="refit"))


@pytest.mark.parametrize(
    "overrides, rows, refits",
    [
        ([], 250_000, True),
        ([], 250_001, False),
        (["trainer.refit=false"], 1_000, False),
        (["trainer.refit=true"], 10_000_000, True),
        (["data.train_on_valid=true"], 1_000, False),
        (["data.protocol=strong_generalization"], 1_000, False),
    ],
)
def test_refit_null_refits_small_training_splits_only(overrides, rows, refits):
    from recsys.job.refit_rule import AUTO_REFIT_MAX_TRAIN_ROWS, decide_refit

    assert AUTO_REFIT_MAX_TRAIN_ROWS == 250_000
    cfg = tiny_config(["trainer.refit=null", *overrides])
    decided, why = decide_refit(cfg, rows, 100)
    assert decided is refits and why.startswith("trainer.refit=")
    assert decide_refit(tiny_config(["trainer.refit=null"]), 1_000, 0)[0] is False  # no valid rows: nothing to add


def test_a_refit_run_writes_results_json_once_finished_and_resumes_an_interrupted_refit(
    refit_run, tmp_path, process_group, monkeypatch
):
    """Until the refit has ranked test the run dir holds no results.json (a reader would take the selection stage's
    for the finished run's); a run interrupted in its refit, started again, ends with the uninterrupted run's
    figures."""
    import recsys.job.run as run_module

    real = run_module._train_and_test

    def preempted_in_the_refit(cfg, run_dir, env, chosen=None, record=None):
        if run_dir.name == REFIT_DIR:
            assert not (run_dir.parent / "results.json").exists()  # the selection stage wrote none
            raise RuntimeError("preempted in the refit")
        return real(cfg, run_dir, env, chosen=chosen, record=record)

    overrides = ["trainer.refit=null", "data.item_neighbors=4", "eval.settings.graph_filter.alphas=[0.1,0.2]"]
    monkeypatch.setattr(run_module, "_train_and_test", preempted_in_the_refit)
    with pytest.raises(RuntimeError, match="preempted in the refit"):
        fit_given_split(tmp_path, overrides)
    assert not (tmp_path / "run" / "results.json").exists()
    monkeypatch.setattr(run_module, "_train_and_test", real)
    _, run_dir, results = fit_given_split(tmp_path, overrides)
    assert json.loads((run_dir / "results.json").read_text())["refit"] == results["refit"]
    uninterrupted = refit_run[2]["refit"]["test"]
    for ranker, metrics in uninterrupted.items():
        assert results["refit"]["test"][ranker] == pytest.approx(metrics, abs=1e-6), ranker
