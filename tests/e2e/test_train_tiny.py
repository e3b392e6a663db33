"""End to end on +experiment=tiny through the real Hydra config tree: the output contract and the margin over popularity."""

import json

import pytest
from hydra.errors import ConfigCompositionException

from recsys.config import TableShardingConfig
from recsys.job.run import fit
from tests.helpers.config import tiny_config

METRIC_KEYS = {"recall@10", "recall@20", "recall@50", "ndcg@10", "ndcg@20"}


@pytest.fixture
def tiny_run(trained_run):
    """The shared tiny run (tests/conftest.py): +experiment=tiny trained to the end by fit()."""
    return trained_run.run_dir, trained_run.results


def test_results_json_contract(tiny_run, data_root):
    run_dir, results = tiny_run
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert on_disk == json.loads(json.dumps(results))
    for split in ("test", "valid"):
        for model in ("two_tower", "popularity"):
            assert METRIC_KEYS <= set(on_disk[split][model]), (split, model)
    assert on_disk["train"]["samples_per_s"] > 0 and on_disk["train"]["seconds"] > 0
    dataset = on_disk["dataset"]
    assert dataset["name"] == "synthetic" and dataset["protocol"] == "recbole"
    assert dataset["dir"].startswith(str(data_root)) and (run_dir / "results.json").is_file()
    # data_pipelines/README.md: TINY spec, recbole, seed 0
    assert {k: dataset["counts"][k] for k in ("train", "valid", "test")} == {
        "train": 15944,
        "valid": 2028,
        "test": 2028,
    }


def test_two_tower_beats_popularity_clearly(tiny_run):
    _, results = tiny_run
    two_tower = results["test"]["two_tower"]["recall@20"]
    popularity = results["test"]["popularity"]["recall@20"]
    assert popularity > 0.1  # the baseline is not broken either
    assert two_tower > 1.3 * popularity, (two_tower, popularity)


def test_metrics_log_and_tensorboard(tiny_run):
    run_dir, results = tiny_run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    valid = [r["valid/recall@20"] for r in records if "valid/recall@20" in r]
    assert len(valid) >= 2 and max(valid) == pytest.approx(results["valid"]["two_tower"]["recall@20"])
    assert losses[-1] < losses[0] - 0.3
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tb").iterdir())


def test_config_typo_is_refused_with_its_path():
    with pytest.raises(ConfigCompositionException, match="epoch"):
        tiny_config(["trainer.epoch=3"])


def test_unknown_sharding_table_is_refused(tmp_path, data_root, process_group):
    cfg = tiny_config([f"data.root={data_root}"])
    cfg.sharding.tables["items"] = TableShardingConfig(sharding_types=["table_wise"])
    with pytest.raises(ValueError, match=r"sharding.tables.items: no such table"):
        fit(cfg, tmp_path)


@pytest.mark.parametrize(
    "override,message",
    [
        ("trainer.global_batch_size=-8", "trainer.global_batch_size=-8: must be >= 1"),
        ("trainer.epochs=-1", "trainer.epochs=-1: must be >= 1"),
        ("model.loss.temperature=0", "model.loss.temperature=0.0: must be > 0"),
        ("model.loss.temperature=-0.05", "model.loss.temperature=-0.05: must be > 0"),
        ("data.history_length=-1", "data.history_length=-1: must be >= 0"),
        ("eval.ks=[0]", r"eval.ks=\[0\]: cut-offs must be >= 1"),
        ("eval.valid_metric=recal@20", "eval.valid_metric='recal@20': choose one of recall@10, recall@20"),
        ("eval.valid_metric=recall@100", "eval.valid_metric='recall@100': choose one of"),
        ("model.tables.item.pooling=max", "model.tables.item.pooling='max': must be 'sum' or 'mean'"),
        ("trainer.precision=fp16", "trainer.precision='fp16': expected one of fp32, bf16, auto"),
    ],
)
def test_values_no_run_can_use_are_refused_before_any_work(override, message):
    """Each used to fail mid-run with an unrelated error (planner assertion, ZeroDivisionError, KeyError after an
    epoch), or to run silently (negative temperature, negative epochs)."""
    with pytest.raises(ValueError, match=message):
        tiny_config([override])


def test_appended_config_typo_is_refused_too():
    with pytest.raises(ValueError, match=r"Key 'epochz' not in 'TrainerConfig'\n    full_key: trainer.epochz"):
        tiny_config(["+trainer.epochz=3"])


@pytest.mark.parametrize(
    "experiment", ["tiny", "movielens", "movielens_side", "movielens_liang", "gowalla", "yelp2018", "daily"]
)
def test_every_experiment_composes(experiment):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config

    register_configs()
    conf = Path(__file__).resolve().parents[2] / "conf"
    assert {p.stem for p in (conf / "experiment").glob("*.yaml")} == {
        "tiny",
        "movielens",
        "movielens_side",
        "movielens_liang",
        "gowalla",
        "yelp2018",
        "daily",
    }
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=[f"+experiment={experiment}"]))
    assert cfg.run_name == experiment and cfg.eval.valid_metric.split("@")[0] in ("recall", "recall_liang")
    if experiment in ("gowalla", "yelp2018"):  # the two leaderboards: one set of settings, the data apart
        assert cfg.data.interactions.md5 and cfg.trainer.epochs == 4 and cfg.trainer.precision == "auto"


def test_a_non_finite_loss_stops_training(tmp_path, data_root, process_group, monkeypatch):
    import recsys.components.losses.softmax as task_module

    real = task_module.sampled_softmax_loss
    monkeypatch.setattr(task_module, "sampled_softmax_loss", lambda *a, **kw: real(*a, **kw) * float("nan"))
    cfg = tiny_config(
        [f"data.root={data_root}", "trainer.epochs=1", "trainer.max_steps_per_epoch=4", "trainer.log_every_steps=2"]
    )
    with pytest.raises(FloatingPointError, match=r"training loss is nan at step 2 \(epoch 0\)"):
        fit(cfg, tmp_path)
    assert not (tmp_path / "results.json").exists()
