"""Continuous training (docs/continuous-training.md): the tiny log with item churn replayed as 3 daily slices through
managed-collision tables (model.id_mapping=managed), on 1 rank here and on 2 ranks in the shared torchrun launch
(tests/helpers/two_rank.py, ``continuous_*``); each slice warm-starts from the one before (weights, optimizer state,
remapping). Also: a 2-rank checkpoint loaded on 1 rank, the serving bundle's raw-id maps, and the refusals."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from data_pipelines.errors import ConfigError, DatasetError
from data_pipelines.synthetic import TINY_SPEC, cache_key, generate
from recsys.config import query_layout
from recsys.data.dataset import Interactions
from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.data.raw_ids import hash_keys, hash_keys_numpy, parse_raw_ids, read_raw_ids
from recsys.data.slices import with_slice
from recsys.distributed.managed import admitted_rows, managed_stats
from recsys.export import ExportConfig, export_run
from recsys.job.run import fit
from recsys.job.trained import load_trained
from recsys.ranking.sharded import Evaluator, embed
from recsys.rundir.config import load_run_config
from recsys.serving.bundle import load_bundle
from recsys.utils.refusals import RunRefused
from tests.helpers.config import tiny_config
from tests.helpers.two_rank import continuous_slice

SLICES = 3
BATCH = 256  # +experiment=tiny's trainer.global_batch_size
TWO_RANK = pytest.mark.two_rank_runs(*(f"continuous_{k}" for k in range(SLICES)))


def read_run(run_dir: Path) -> tuple[list[float], dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r], json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def replay(tmp_path_factory, data_root, process_group) -> Path:
    """The 3 slices on 1 rank, each warm-started from the last: run dirs ``s0``, ``s1``, ``s2``."""
    root = tmp_path_factory.mktemp("replay")
    for k in range(SLICES):
        fit(tiny_config([*continuous_slice(k, str(root), "s"), f"data.root={data_root}"]), root / f"s{k}")
    return root


def saved_tensor(run_dir: Path, key_end: str) -> torch.Tensor:
    """The tensor whose key ends with ``key_end`` in the run's newest step checkpoint (DCP, read on this rank)."""
    path = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    key = next(k for k in metadata if k.endswith(key_end))
    out = {key: torch.zeros(metadata[key].size, dtype=metadata[key].properties.dtype)}
    dcp.load(out, checkpoint_id=str(path))
    return out[key]


def test_each_slice_warm_starts_from_the_last_admits_new_ids_and_counts_evictions(replay):
    runs = [read_run(replay / f"s{k}") for k in range(SLICES)]
    # warm: each slice continues the last one's optimizer (Adam's step) and remapping (the MCH modules' step count)
    steps = [results["train"]["steps"] for _, results in runs]
    for k in range(SLICES):
        total = sum(steps[: k + 1])
        assert int(saved_tensor(replay / f"s{k}", "query_tower.0.weight.step")) == total
        assert int(saved_tensor(replay / f"s{k}", "item._current_iter_tensor")) == total
    managed = [results["managed"] for _, results in runs]
    for k, (_, results) in enumerate(runs):
        counts = results["dataset"]["counts"]
        assert counts["valid"] == 0 and results["rankers"].keys() == {"two_tower", "popularity"}
        if k:  # trained on its own slice only (the previous run's test slice), with the earlier ones as history
            examples = runs[k - 1][1]["dataset"]["counts"]["test"]
            assert counts["train"] == runs[k - 1][1]["dataset"]["counts"]["train"] + examples
            assert results["train"]["steps"] == 2 * -(-examples // BATCH)  # 2 epochs
    # new ids get rows; the remapping carries over (ids held = before + admitted - evicted); the item table (223
    # ids) fills in slice 2, where LRU evicts
    assert managed[0]["item"]["ids"] == managed[0]["item"]["admitted"] > 0 and managed[0]["item"]["evicted"] == 0
    for k in (1, 2):
        for table in ("user", "item"):
            now, before = managed[k][table], managed[k - 1][table]
            assert now["ids"] == before["ids"] + now["admitted"] - now["evicted"], (k, table)
    assert managed[1]["item"]["admitted"] > 0 and managed[1]["item"]["evicted"] == 0
    assert managed[2]["item"]["evicted"] > 0 and managed[2]["item"]["ids"] == 223
    assert managed[2]["user"]["ids"] == 400 and managed[2]["user"]["rows"] == 512


@pytest.mark.multiprocess
@TWO_RANK
def test_two_ranks_follow_one_rank_slice_by_slice(replay, two_rank_runs):
    for k in range(SLICES):
        single, one = read_run(replay / f"s{k}")
        double, two = read_run(two_rank_runs[f"continuous_{k}"])
        assert len(single) == len(double) and two["train"]["world_size"] == 2
        # slices 0 and 1: no table overflows, the same ids get rows from the same values (drawn from each id, not its
        # row); two ranks drop the odd last row of an epoch (equal row-wise shares). Slice 2 overflows, and each rank
        # evicts within its own half of the key space: close, not equal
        tolerance = 2e-3 if k < 2 else 3e-2
        for step, (a, b) in enumerate(zip(single, double)):
            assert b == pytest.approx(a, rel=tolerance), f"slice {k} step {step}: 1 rank {a}, 2 ranks {b}"
        assert two["test"]["two_tower"]["recall@20"] == pytest.approx(
            one["test"]["two_tower"]["recall@20"], abs=5e-3 if k < 2 else 3e-2
        )
        if k < 2:
            assert two["managed"] == one["managed"]


@pytest.mark.multiprocess
@TWO_RANK
def test_a_two_rank_checkpoint_reshards_to_one_rank_with_its_remapping(
    replay, two_rank_runs, process_group, data_root, tmp_path
):
    run_dir = two_rank_runs["continuous_2"]
    _, two = read_run(run_dir)
    cfg = load_run_config(run_dir)
    data, _, sharded, _ = load_trained(cfg, run_dir, "", process_group)
    # every id keeps its row: the one process ranks the next slice as the two did, and holds the same ids
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    metrics = Evaluator(data, builder, ks=[20], batch_size=256, chunk_size=256).evaluate(
        sharded.two_tower.eval(), "test", device=torch.device("cpu")
    )
    assert metrics["two_tower"]["recall@20"] == pytest.approx(two["test"]["two_tower"]["recall@20"], abs=1e-6)
    held = managed_stats(sharded.module, 1)
    assert {t: c["ids"] for t, c in held.items()} == {t: c["ids"] for t, c in two["managed"].items()}
    del sharded

    # and a 1-rank slice 2 warm-started from the 2-rank slice 1 (weights, optimizer state and remapping resharded)
    # trains as the 1-rank slice 2 from the 1-rank slice 1
    overrides = [
        *continuous_slice(2, str(two_rank_runs["continuous_1"].parent), "continuous_"),
        f"data.root={data_root}",
    ]
    fit(tiny_config(overrides), tmp_path / "s2_from_two_ranks")
    resharded, results = read_run(tmp_path / "s2_from_two_ranks")
    single, one = read_run(replay / "s2")
    for step, (a, b) in enumerate(zip(single, resharded)):
        assert b == pytest.approx(a, rel=3e-3), f"step {step}: from 1 rank {a}, from 2 ranks {b}"
    assert results["managed"]["item"]["evicted"] == one["managed"]["item"]["evicted"]


def test_the_bundle_maps_raw_ids_to_the_runs_rows(replay, process_group):
    run_dir = replay / "s2"
    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    cfg = load_run_config(run_dir)
    data, _, sharded, _ = load_trained(cfg, run_dir, "", process_group)
    two_tower = sharded.two_tower.eval()
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, _, _, timeline = Evaluator(data, builder, ks=[20], batch_size=64, chunk_size=64).protocol("test")
    expected = embed(
        two_tower, builder, side="query", ids=users, timeline=timeline, batch_size=64, device=torch.device("cpu")
    )
    del sharded
    bundle = load_bundle(bundle_dir)
    assert bundle.manifest["id_mapping"] == "managed" and set(bundle.served.part("two_tower").id_maps) == {
        "user",
        "item",
    }
    lengths, items = latest_items(timeline, users, data.num_users, cfg.data.history_length)
    np.testing.assert_allclose(bundle.encode_part("two_tower", users, lengths, items), expected, rtol=1e-5, atol=1e-6)
    # raw ids straight in: the same queries; a user id the tables never held gets the shared row (zeros)
    raw = bundle.encode_raw(data.raw_user_ids[users], lengths, data.raw_item_ids[items])
    np.testing.assert_allclose(raw, expected, rtol=1e-5, atol=1e-6)
    stranger = bundle.encode_raw(
        np.array([2**64 - 5], dtype=np.uint64).astype(np.int64), lengths[:1], items[: lengths[0]]
    )
    assert stranger.shape == (1, expected.shape[1])


def test_resuming_with_another_zch_size_policy_or_an_earlier_slice_is_refused(replay, data_root, tmp_path):
    def start(k: int, *extra: str, source: str = "") -> None:
        overrides = [*continuous_slice(k, str(replay), "s"), f"data.root={data_root}", *extra]
        if source:
            overrides = [o for o in overrides if not o.startswith("trainer.init_from=")]
            overrides.append(f"trainer.init_from={replay / source}")
        fit(tiny_config(overrides), tmp_path / "x")

    with pytest.raises(RunRefused, match=r"zch_size\.item=224, this run model\.managed\.zch_size\.item=256"):
        start(1, "model.managed.zch_size.item=256")
    with pytest.raises(RunRefused, match=r"eviction_policy=lru, this run has model\.managed\.eviction_policy=lfu"):
        start(1, "model.managed.eviction_policy=lfu")
    with pytest.raises(RunRefused, match=r"data\.slice=1 \(times .*\) overlaps or precedes the slice"):
        start(1, source="s1")
    with pytest.raises(RunRefused, match="model.id_mapping=managed, this run has model.id_mapping=vocab"):
        start(1, "model.id_mapping=vocab")


def test_slices_and_ids_that_cannot_work_are_refused(tiny_data, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.train_on_valid=False: data\.slices=4 holds nothing out"):
        tiny_config(["data.slices=4", "data.slice=1"])
    with pytest.raises(ConfigError, match=r"data\.slice=3: must be in 0\.\.2"):
        tiny_config(["data.slices=4", "data.slice=3", "data.train_on_valid=true"])
    with pytest.raises(ConfigError, match=r"model\.managed\.zch_size\.item=1: must be >= 2"):
        tiny_config(["model.id_mapping=managed", "model.managed.zch_size.item=1"])
    # a window with no rows: named with its time range
    times = np.r_[np.arange(10), 100 + np.arange(10)].astype(np.int64)
    rows = Interactions(np.zeros(20, dtype=np.int64), np.arange(20, dtype=np.int64) % 5, times)
    empty = Interactions(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    gap = replace(tiny_data, splits={"train": rows, "valid": empty, "test": empty})
    with pytest.raises(DatasetError, match=r"data\.slice=0: slice 1 of data\.slices=4 \(times \[28, 55\).*has no rows"):
        with_slice(gap, 4, 0)
    sliced = with_slice(gap, 2, 0)
    assert len(sliced.splits["train"]) == len(sliced.splits["test"]) == 10 and sliced.example_since == 0
    # ids beyond 64 bits, or not integers, named with the file, row and value
    pd.DataFrame({"raw_id": ["7", "18446744073709551615", "18446744073709551616"], "item_id": [0, 1, 2]}).to_parquet(
        tmp_path / "items.parquet"
    )
    with pytest.raises(DatasetError, match=r"items\.parquet: row 3: raw_id = 18446744073709551616 is beyond 64 bits"):
        read_raw_ids(tmp_path / "items.parquet", "item_id", 3)
    with pytest.raises(DatasetError, match=r"row 1: raw_id = 'i7' is not an integer"):
        parse_raw_ids(np.array(["i7"], dtype=object), "vocab/items.parquet", "raw_id")
    assert parse_raw_ids(np.array(["18446744073709551615", "-3"], dtype=object), "f", "raw_id").tolist() == [-1, -3]


def test_raw_ids_hash_alike_in_the_model_and_the_bundle_and_rows_start_from_their_id():
    ids = np.r_[np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 10_000), [0, -1, 2**63 - 1, -(2**63)]]
    keys = hash_keys_numpy(ids)
    assert np.array_equal(keys, hash_keys(torch.from_numpy(ids)).numpy())
    assert keys.min() >= 0 and keys.max() < 2**63 - 1 and len(np.unique(keys)) == len(ids)
    halves = np.bincount(hash_keys_numpy(np.arange(10_000)) >= 2**62)  # sequential ids: both ranks' halves
    assert abs(int(halves[0]) - 5000) < 200
    a = admitted_rows(torch.tensor([5, 9]), seed=0, table="item", num_rows=100, dim=4)
    b = admitted_rows(torch.tensor([9]), seed=0, table="item", num_rows=100, dim=4)
    assert torch.equal(a[1], b[0]) and not torch.equal(a[0], a[1]) and a.abs().max() <= 0.1


def test_item_churn_brings_new_items_each_period_and_leaves_churn_free_data_alone():
    spec = replace(TINY_SPEC, churn_periods=4, item_lifetime_periods=2)
    interactions, _, _ = generate(spec)
    assert not interactions.duplicated(["user_id", "item_id"]).any()
    period = (interactions["timestamp"] - spec.start_timestamp) * 4 // spec.time_span_seconds
    items = [set(interactions["item_id"][period == p]) for p in range(4)]
    for p in range(1, 4):
        assert len(items[p] - items[p - 1]) > 0.25 * len(items[p])  # new items
        assert len(items[p - 1] - items[p]) > 0.25 * len(items[p - 1])  # gone items
    users = [interactions["user_id"][period == p].nunique() for p in range(4)]
    assert min(users) > 0.9 * spec.num_users  # users stay across periods
    assert cache_key(TINY_SPEC, "recbole", 0) == cache_key(replace(TINY_SPEC, item_lifetime_periods=5), "recbole", 0)


def test_the_managed_counts_of_a_killed_and_resumed_run_are_the_whole_runs(data_root, process_group, tmp_path):
    """Issue 43 item 5: results.json's managed counts describe the whole run, also when it was killed and resumed
    (they were the resumed process's alone: 0 ids admitted where the run admitted every id it holds)."""
    overrides = [*continuous_slice(0, str(tmp_path), "s"), f"data.root={data_root}", "trainer.checkpoint_every_steps=3"]
    whole = fit(tiny_config([*overrides, "trainer.keep_last_checkpoints=0"]), tmp_path / "whole")

    # the state a kill after step 3 (mid-epoch 0) leaves: the checkpoints up to it, no results
    killed = tmp_path / "killed"
    fit(tiny_config([*overrides, "trainer.keep_last_checkpoints=0"]), killed)
    for path in (killed / "checkpoints").iterdir():
        if path.name != "step_00000003":
            shutil.rmtree(path)
    (killed / "results.json").unlink()
    resumed = fit(tiny_config(overrides), killed)  # trainer.resume=auto
    assert resumed["train"]["steps"] == whole["train"]["steps"]
    assert whole["managed"]["item"]["admitted"] == whole["managed"]["item"]["ids"] > 0
    assert resumed["managed"] == whole["managed"]


def test_the_daily_experiment_on_the_users_own_log_names_it_as_theirs(tmp_path):
    """Issue 43 item 16: +experiment=daily data=interactions named the user's dataset synthetic_churn-...; the
    generator's churn settings are the synthetic_churn data group's, which data=interactions replaces."""
    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config
    from tests.helpers.config import CONF_DIR

    def daily_config(*overrides: str):
        register_configs()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return to_config(compose(config_name="config", overrides=["+experiment=daily", *overrides]))

    (tmp_path / "log.csv").write_text("user_id,item_id,timestamp\n1,2,3\n")
    own = daily_config("data=interactions", f"data.interactions.path={tmp_path / 'log.csv'}")
    assert own.data.name == "interactions" and own.data.source == "interactions"
    assert own.data.slices == 8 and own.model.id_mapping == "managed"  # the experiment's replay still applies
    daily = daily_config()  # its own data: the generator with item churn, as before
    assert daily.data.name == "synthetic_churn" and daily.data.synthetic.churn_periods == 8
    assert (daily.data.synthetic.num_users, daily.data.synthetic.num_items) == (2000, 4000)
