"""The budgeted search on valid (recsys/tune/): a tiny search picks its best trial and trains it as a servable run,
never reads the test split, keeps to its budget, proposes the same settings for the same seed, refuses a budget of 0."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recsys.config import check_values, value_at, with_values
from recsys.export import ExportConfig, export_run
from recsys.job.run import fit, search_trial
from recsys.rankers.served_dir import served_ranking
from recsys.ranking.sharded import Evaluator
from recsys.serving.bundle import load_bundle
from recsys.tune.search import chosen_config, search
from recsys.tune.tuned_run import tune_and_fit
from tests.helpers.config import tiny_config
from tests.helpers.launch import launch


def test_a_tiny_search_trains_its_best_trial_as_a_servable_run(tmp_path, data_root, process_group):
    cfg = tiny_config(
        [
            f"data.root={data_root}",
            "tune.budget_minutes=10",
            "tune.max_trials=3",
            "trainer.epochs=2",
            "tune.min_gain_se=0",
        ]
    )
    run_dir = tmp_path / "run"
    results = tune_and_fit(cfg, run_dir, fit, search_trial)
    table = json.loads((run_dir / "tune" / "trials.json").read_text())
    trials = table["trials"]
    assert len(trials) == 3 and all(t["state"] == "complete" for t in trials)
    best = max(trials, key=lambda t: t["valid"])
    assert table["chosen"] == best["number"] and table["values"] == best["values"]
    assert (run_dir / "tune" / "trials.md").read_text().count("| complete |") == 3
    # the run trained the chosen settings: the valid figure of what it serves is the chosen trial's, to the last
    # digit (each trial is ranked by what its run would serve: tiny serves the best on valid of the two-tower and
    # its fusions with the graph filter and EASE)
    assert {t["served"] for t in trials} <= {"two_tower", "two_tower+graph_filter", "two_tower+ease"}
    assert results["headline"]["ranker"] == best["served"]
    assert best["valid"] == results["valid"][best["served"]]["recall@20"]
    assert not any((run_dir / "tune" / f"trial_{t['number']}" / "checkpoints").exists() for t in trials)
    # and it is served: the bundle ranks test as the run did
    bundle = load_bundle(export_run(ExportConfig(run_dir=str(run_dir))))
    users, topk = served_ranking(run_dir)
    assert bundle.manifest["ranker"] == results["headline"]["ranker"] and len(users) == topk.shape[0]
    # the same command on the finished run reports it, without searching again
    again = tune_and_fit(cfg, run_dir, fit, lambda *a: pytest.fail("searched again"))
    assert again["valid"] == results["valid"]


def test_the_search_never_reads_the_test_split(tmp_path, data_root, process_group, monkeypatch):
    read = []
    real = Evaluator.protocol

    def protocol(self, split, **kwargs):
        read.append(split)
        return real(self, split, **kwargs)

    monkeypatch.setattr(Evaluator, "protocol", protocol)
    cfg = tiny_config([f"data.root={data_root}", "tune.budget_minutes=10", "tune.max_trials=2", "trainer.epochs=1"])
    trials = search(cfg, tmp_path, search_trial)
    assert len(trials) == 2 and read and set(read) == {"valid"}
    best = max(trials, key=lambda t: t.valid)
    for trial in {trials[0].number: trials[0], best.number: best}.values():  # the compared ones keep their users'
        users, figures = trial.per_user  # figures, whose mean is the trial's valid figure
        assert 0 < len(users) <= trial.valid_users and np.all(np.diff(users) > 0)
        assert figures.mean() == pytest.approx(trial.valid, abs=1e-12)


def _fake_trial(seconds: float, clock: list[float], figures=None):
    """A stand-in for a trial's training: advances the fake clock by ``seconds`` and scores a fixed figure."""

    def train(cfg, trial_dir, deadline, on_epoch=None):
        clock[0] += seconds
        value = figures.pop(0) if figures else float(cfg.model.loss.temperature)
        return {"train": {"best_valid": value, "best_epoch": 0}}

    return train


def test_a_trial_that_would_not_fit_the_budget_is_not_started(tmp_path):
    """A 10-minute budget and trials of 3 minutes: three run (9 min), a fourth (up to 12 min) is not started."""
    clock = [0.0]
    cfg = tiny_config(["tune.budget_minutes=10"])
    trials = search(cfg, tmp_path, _fake_trial(180.0, clock), clock=lambda: clock[0])
    assert len(trials) == 3 and clock[0] == 540.0
    assert [t.valid for t in trials] == [t.values["model.loss.temperature"] for t in trials]


def test_a_stop_inside_the_search_says_the_search_restarts(tmp_path):
    """SIGTERM / Ctrl-C during a trial: the one line says the same command searches again from trial 0 (it does: the
    study is not stored), not that it resumes from the trial's checkpoint."""
    from recsys.rundir.preemption import Preempted

    clock = [0.0]
    finished = _fake_trial(60.0, clock)

    def second_is_stopped(cfg, trial_dir, deadline, on_epoch=None):
        if clock[0] > 0:
            raise Preempted(7, str(trial_dir / "checkpoints" / "step_7"))
        return finished(cfg, trial_dir, deadline, on_epoch)

    cfg = tiny_config(["tune.budget_minutes=10"])
    with pytest.raises(
        Preempted, match=r"search was at trial 1; the same command starts the search again from trial 0"
    ):
        search(cfg, tmp_path, second_is_stopped, clock=lambda: clock[0])


def test_the_same_seed_proposes_the_same_settings(tmp_path):
    def values(seed: int) -> list[dict]:
        clock = [0.0]
        cfg = tiny_config(["tune.budget_minutes=100", "tune.max_trials=4", f"tune.seed={seed}"])
        return [t.values for t in search(cfg, tmp_path, _fake_trial(1.0, clock), clock=lambda: clock[0])]

    first = values(0)
    assert first == values(0) and first != values(1)
    for v in first[1:]:  # the sampler's, inside the default space (trial 0 is tiny's config as given)
        assert 0.03 <= v["model.loss.temperature"] <= 0.3 and v["model.tables.item.embedding_dim"] in (64, 128, 256)


def test_a_budget_of_zero_and_a_knob_of_no_key_are_refused():
    with pytest.raises(ValueError, match=r"tune.budget_minutes=0.0: must be > 0 minutes"):
        check_values(tiny_config(["tune.budget_minutes=0"]))
    bad_space = "tune.space=[{key: model.temprature, kind: log, low: 0.1, high: 1.0}]"
    with pytest.raises(ValueError, match=r"tune.space\[0\].key='model.temprature': must name a key"):
        check_values(tiny_config([bad_space, "tune.budget_minutes=5"]))
    # without a search the space is unused: the default one's model.loss.temperature is no key of the ccl loss
    check_values(tiny_config(["model/loss=ccl"]))
    with pytest.raises(ValueError, match=r"tune.space\[0\].key='model.loss.temperature': must name a key"):
        check_values(tiny_config(["model/loss=ccl", "tune.budget_minutes=5"]))
    assert np.isfinite(tiny_config(["tune.budget_minutes=5"]).tune.budget_minutes)


def test_the_first_trial_is_the_configured_settings(tmp_path):
    """Trial 0 trains the config's own values exactly, so a short search never chooses below the run it replaces:
    tiny's history_length 10 and item dim 16 (neither a choice of the space) and a temperature above its range
    included; the later trials are the sampler's, inside the space."""
    clock = [0.0]
    cfg = tiny_config(
        ["tune.budget_minutes=100", "tune.max_trials=3", "model.loss.temperature=0.5"]
    )  # above [0.03, 0.3]
    trials = search(cfg, tmp_path, _fake_trial(1.0, clock, figures=[0.9, 0.1, 0.2]), clock=lambda: clock[0])
    assert trials[0].values == {knob.key: value_at(cfg, knob.key) for knob in cfg.tune.space}
    assert trials[0].values["data.history_length"] == 10 and trials[0].values["model.tables.item.embedding_dim"] == 16
    assert trials[0].values["model.loss.temperature"] == 0.5
    for later in trials[1:]:
        assert later.values["data.history_length"] in (20, 50, 100, 200)
        assert 0.03 <= later.values["model.loss.temperature"] <= 0.3
    final, best, _ = chosen_config(cfg, trials)
    assert best.number == 0 and final == cfg  # the best on valid (0.9) is the configured run, as configured


def test_a_trial_stopped_at_the_budget_is_never_chosen(tmp_path):
    """A budget too small for any trial: trial 0 is stopped after an epoch, so its settings were not trained out; it
    is not chosen, and the run trains the settings as configured and says so (the table and the log)."""
    clock = [0.0]
    cfg = tiny_config(["tune.budget_minutes=0.05"])  # 3 s

    def stopped(cfg_, trial_dir, deadline, on_epoch=None):
        clock[0] += 60.0  # one epoch, past the deadline: the trainer stops there
        return {"train": {"best_valid": 0.5, "best_epoch": 0}, "finished": False}

    trials = search(cfg, tmp_path, stopped, clock=lambda: clock[0])
    assert [t.state for t in trials] == ["stopped at the budget"]
    final, best, why = chosen_config(cfg, trials)
    assert best is None and final == cfg
    assert why == "no trial completed within the budget: the run trains the settings as configured"
    # a trial that ran out its epochs is complete even when its last epoch ended past the deadline
    clock = [0.0]

    def finished(cfg_, trial_dir, deadline, on_epoch=None):
        clock[0] += 60.0
        return {"train": {"best_valid": 0.5, "best_epoch": 1}, "finished": True}

    assert [t.state for t in search(cfg, tmp_path, finished, clock=lambda: clock[0])] == ["complete"]


def test_a_budget_too_small_for_any_trial_trains_the_configured_run(tmp_path, data_root, caplog):
    """The real trainer stopped by the deadline (a budget of 0.06 s, 2 epochs of the tiny data): the trial's state is
    "stopped at the budget", trials.md says the configured settings train, and the run trains tiny's own history
    length and item width (both outside the search space)."""
    cfg = tiny_config([f"data.root={data_root}", "tune.budget_minutes=0.001", "trainer.epochs=2"])
    trained = {}

    def fit_spy(final, run_dir, record=None):
        trained["cfg"] = final
        return {}

    with caplog.at_level("WARNING"):
        tune_and_fit(cfg, tmp_path, fit_spy, search_trial)
    table = json.loads((tmp_path / "tune" / "trials.json").read_text())
    assert [t["state"] for t in table["trials"]] == ["stopped at the budget"] and table["chosen"] is None
    assert "No trial completed: the run trains the settings as given." in (tmp_path / "tune" / "trials.md").read_text()
    assert trained["cfg"] == cfg and trained["cfg"].data.history_length == 10
    assert "no trial completed within the budget" in caplog.text


def _fake_curves(curves: list[list[float]], clock: list[float]):
    """A stand-in trial that validates an epoch a second with the given figures, stopping where ``on_epoch`` says."""

    def train(cfg, trial_dir, deadline, on_epoch=None):
        scores = []
        for epoch, score in enumerate(curves.pop(0)):
            clock[0] += 1.0
            scores.append(score)
            if on_epoch is not None and on_epoch(epoch, score):
                break
        return {"train": {"best_valid": max(scores), "best_epoch": scores.index(max(scores)), "epochs": len(scores)}}

    return train


def test_a_trial_behind_the_median_is_pruned_and_not_chosen(tmp_path):
    """Two trials end; the third is behind both at its 2nd epoch (the first one pruning looks at): stopped there,
    its state says so, and the choice is among the completed ones. With tune.prune=false it runs out; at its last
    epoch a trial is never pruned (it would save nothing)."""
    curves = [[0.30, 0.40, 0.45], [0.31, 0.41, 0.44], [0.29, 0.20, 0.99]]
    clock = [0.0]
    cfg = tiny_config(["tune.budget_minutes=100", "tune.max_trials=3", "trainer.epochs=3"])
    trials = search(cfg, tmp_path, _fake_curves([list(c) for c in curves], clock), clock=lambda: clock[0])
    assert [t.state for t in trials] == ["complete", "complete", "pruned at epoch 1"]
    assert clock[0] == 3 + 3 + 2  # the pruned trial trained 2 of its 3 epochs
    assert chosen_config(cfg, trials)[1].number == 0
    clock = [0.0]
    unpruned = tiny_config(["tune.budget_minutes=100", "tune.max_trials=3", "trainer.epochs=3", "tune.prune=false"])
    trials = search(unpruned, tmp_path, _fake_curves([list(c) for c in curves], clock), clock=lambda: clock[0])
    assert [t.state for t in trials] == ["complete"] * 3 and chosen_config(unpruned, trials)[1].number == 2
    clock = [0.0]
    cfg = tiny_config(["tune.budget_minutes=100", "tune.max_trials=3", "trainer.epochs=2"])
    trials = search(cfg, tmp_path, _fake_curves([c[:2] for c in curves], clock), clock=lambda: clock[0])
    assert [t.state for t in trials] == ["complete"] * 3


def search_under_torchrun(tmp_path, data_root, *overrides: str):
    """A 3-trial search of the tiny experiment on 2 gloo ranks, then its run; returns the run dir."""
    run_dir = tmp_path / "run"
    launch(
        [
            "-m", "recsys.train", "+experiment=tiny", f"data.root={data_root}", f"hydra.run.dir={run_dir}",
            "sharding.device=cpu", "tune.budget_minutes=10", "tune.max_trials=3", "trainer.epochs=2",
            "trainer.progress_bar=false", "tune.min_gain_se=0", *overrides,
        ],
        nproc=2,
    )  # fmt: skip
    return run_dir


def test_under_torchrun_every_trial_and_the_run_train_on_both_ranks(tmp_path, data_root):
    """Two ranks (gloo): rank 0's decisions reach both (a rank that started a trial the other did not would hang the
    job), the table lists every trial, and the run trains the chosen settings to the chosen trial's valid figure."""
    run_dir = search_under_torchrun(tmp_path, data_root, "data.shard_by_user=true")
    table = json.loads((run_dir / "tune" / "trials.json").read_text())
    results = json.loads((run_dir / "results.json").read_text())
    assert len(table["trials"]) == 3 and all(t["state"] == "complete" for t in table["trials"])
    best = max(table["trials"], key=lambda t: t["valid"])
    assert table["chosen"] == best["number"]
    assert results["train"]["world_size"] == 2
    # the trial's figure is that of what the run serves, which the run's stage chose again on the same weights
    assert results["headline"]["ranker"] == best["served"]
    assert results["valid"][best["served"]]["recall@20"] == pytest.approx(best["valid"], abs=1e-9)
    # each rank ranked its own users (data.shard_by_user): the trials were compared over both ranks' users
    assert f"paired over {int(results['valid']['two_tower']['num_users_evaluated'])} users" in table["why"]


def test_a_run_that_will_refit_keeps_a_training_of_its_budget_for_the_refit(tmp_path):
    """trainer.refit=null refits a small training split (recsys/job/refit_rule.py): the 10-minute budget keeps trial 0's
    3 minutes for the refit, so two trials run where a run without a refit runs three."""

    def trial(clock):
        fake = _fake_trial(180.0, clock)
        return lambda *a, **k: {**fake(*a, **k), "dataset": {"counts": {"train": 1000, "valid": 100, "test": 100}}}

    for refit, expected in (("null", 2), ("false", 3), ("true", 2)):
        clock = [0.0]
        cfg = tiny_config(["tune.budget_minutes=10", f"trainer.refit={refit}"])
        assert len(search(cfg, tmp_path, trial(clock), clock=lambda c=clock: c[0])) == expected, refit


def test_the_configured_settings_stay_unless_the_best_leads_by_more_than_valids_noise(tmp_path):
    """The one-standard-error rule, corrected for the best of N: on 1,000 valid users (no per-user figures) trial 0's
    0.30 has a standard error of at most sqrt(0.3 x 0.7 / 1000) = 0.0145, and the best of 2 other trials must lead by
    more than sqrt(2 ln 2) = 1.18 of them (0.0171): a lead of 0.01 keeps trial 0, one of 0.03 moves; 0 turns it off."""

    def trial(clock, figures):
        fake = _fake_trial(1.0, clock, figures=figures)
        return lambda *a, **k: {**fake(*a, **k), "dataset": {"counts": {"users": 1000, "valid": 1500}}}

    for figures, min_gain_se, chosen in (
        ([0.30, 0.31, 0.29], 1.0, 0),
        ([0.30, 0.31, 0.33], 1.0, 2),
        ([0.30, 0.31, 0.29], 0.0, 1),
    ):
        clock = [0.0]
        cfg = tiny_config(["tune.budget_minutes=10", "tune.max_trials=3", f"tune.min_gain_se={min_gain_se}"])
        trials = search(cfg, tmp_path, trial(clock, list(figures)), clock=lambda c=clock: c[0])
        assert [t.valid_users for t in trials] == [1000] * 3
        final, best, why = chosen_config(cfg, trials)
        assert best.number == chosen, (figures, min_gain_se)
        if (figures[1], min_gain_se) == (0.31, 1.0) and chosen == 0:
            assert why == (
                "trial 0, the configured settings: the best of 2 others, trial 1, is 0.0100 ahead on valid, within "
                "tune.min_gain_se=1 x 1.18 (sqrt(2 ln 2)) standard errors of that lead (0.0145, bounded, 1000 users)"
            )
        assert final == with_values(cfg, trials[chosen].values)


def _paired_trial(clock: list[float], per_user: list[np.ndarray]):
    """A stand-in trial whose best epoch kept each of 1,000 valid users' figure (the arrays, in turn)."""
    users = np.arange(1000, dtype=np.int64)

    def train(cfg, trial_dir, deadline, on_epoch=None):
        clock[0] += 1.0
        figures = per_user.pop(0)
        return {"train": {"best_valid": float(figures.mean()), "best_epoch": 0}, "valid_users": (users, figures)}

    return train


def test_a_lead_the_same_users_agree_on_moves_where_one_of_noise_does_not(tmp_path):
    """Trials that keep their users' figures are compared user by user: a lead of 0.01 that every user shows (their
    differences' standard error ~0) moves to the best, though under the 0.0145 bound that stops the test above; the
    same lead made of users who gain or lose 0.3 at random (standard error 0.3 / sqrt(1000) = 0.0095, x 1.18 for the
    best of 2) keeps the configured settings."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0.0, 0.6, 1000)
    consistent = base + 0.01
    swings = rng.permutation(np.r_[np.full(517, 0.3), np.full(483, -0.3)])  # mean +0.0102
    noisy = base + swings
    for second, chosen in ((consistent, 1), (noisy, 0)):
        clock = [0.0]
        cfg = tiny_config(["tune.budget_minutes=10", "tune.max_trials=3"])
        per_user = [base, second, base - 0.05]
        trials = search(cfg, tmp_path, _paired_trial(clock, per_user), clock=lambda c=clock: c[0])
        final, best, why = chosen_config(cfg, trials)
        assert trials[1].valid - trials[0].valid == pytest.approx(second.mean() - base.mean())
        assert trials[2].per_user is None  # neither trial 0 nor the best: its figures are not kept
        assert best.number == chosen, why
        assert "paired over 1000 users" in why
        assert final == with_values(cfg, trials[chosen].values)


def test_the_trials_are_ranked_by_what_the_run_serves_with_one_graph_filter_fit(
    tmp_path, data_root, process_group, monkeypatch
):
    """Each trial's figure is the valid figure of the ranker its run would serve (tiny's default: the best of the
    two-tower and its fusions), with the graph filter fit once for the whole search, not once a trial."""
    from recsys.job.run_stage import fits_kept_between_trainings
    from recsys.rankers.graph_filter.ranker import GraphFilterRanker

    fitted = []
    original = GraphFilterRanker.fit

    def counted(self, split, fits):
        fitted.append(split.name)
        return original(self, split, fits)

    monkeypatch.setattr(GraphFilterRanker, "fit", counted)
    cfg = tiny_config([f"data.root={data_root}", "tune.budget_minutes=10", "tune.max_trials=3", "trainer.epochs=1"])
    with fits_kept_between_trainings():
        trials = search(cfg, tmp_path, search_trial)
    assert fitted == ["valid"]
    for trial in trials:  # the served ranker's figure, never below the two-tower's alone (it is one of the choices)
        assert trial.served in ("two_tower", "two_tower+graph_filter", "two_tower+ease")
        assert trial.per_user is None or trial.per_user[1].mean() == pytest.approx(trial.valid)
    assert any(t.served != "two_tower" for t in trials)
    # outside a search nothing is kept: the next fit is made again
    search(with_values(cfg, {"tune.max_trials": 1}), tmp_path, search_trial)
    assert fitted == ["valid", "valid"]
