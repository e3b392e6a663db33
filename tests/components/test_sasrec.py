"""model/query_encoder=sasrec: the config's refusals, the sequence encoder's shapes and padding invariance, and a tiny
temporal leave-one-out run that trains, beats popularity, is reproduced by ``recsys.evaluate`` and whose exported
bundle recommends the run's own test ranking."""

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchrec.sparse.jagged_tensor import JaggedTensor

from recsys.components.query_encoders.sequence import SequenceEncoder, padded_history
from recsys.config import ExportConfig, query_layout
from recsys.config.fingerprint import config_fingerprint
from recsys.data.eval_batches import latest_items
from recsys.data.feature_builder import FeatureBuilder
from recsys.job.trained import load_trained
from recsys.rankers.served_dir import served_ranking
from recsys.ranking.sharded import Evaluator
from recsys.serving.bundle import load_bundle
from tests.helpers.config import tiny_config

SASREC = ["data.protocol=loo", "data.query_history=recent", "model/query_encoder=sasrec"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model/query_encoder=sasrec"],
            r"model.query_encoder.name='sasrec': .*needs data.query_history=recent.*'profile'",
        ),
        (
            [*SASREC, "data.history_length=0"],
            r"model.query_encoder.name='sasrec': .*data.history_length > 0 .*data.history_length=0",
        ),
        (
            [*SASREC, "model.query_encoder.num_heads=3"],
            r"model.query_encoder.num_heads=3: must be >= 1 and divide model.query_encoder.dim=64",
        ),
        ([*SASREC, "model.query_encoder.dropout=1.0"], r"model.query_encoder.dropout=1.0: must be in \[0, 1\)"),
        (["model/query_encoder=gru"], "query_encoder"),
        (["model.query_encoder=sasrec"], r"model.query_encoder='sasrec': .*choose one with model/query_encoder=NAME"),
        (["model.query_encoder.dim=32"], r"model.query_encoder.dim: not a setting of model.query_encoder.name=bag"),
    ],
)
def test_config_refuses_what_sasrec_cannot_use(overrides, message):
    with pytest.raises(Exception, match=message):
        tiny_config(overrides)


def test_fingerprints_of_bag_runs_do_not_change():
    # the values main computed before the option existed: existing runs resume and evaluate as before
    # (model.query_neighbors=false: what a run from before that option built; tests/data/test_item_neighbors.py)
    off = ["model.query_neighbors=false", "model.item_bias=false", "model.loss.mask_history=false"]  # before both
    assert config_fingerprint(tiny_config(off)) == "53abeecc055bb0bf"
    # a run saved then holds the synthetic data's 0.25 dropout (the protocol now resolves loo's 0.0 when unset)
    loo = ["data.protocol=loo", "data.query_history=recent", "data.history_dropout=0.25", *off]
    assert config_fingerprint(tiny_config(loo)) == "1e07c644d9d1ea89"
    # the values main computed before query encoders were components (model.query_encoder=sasrec, model.sasrec.*)
    before = ["model.item_bias=false", "model.loss.mask_history=false"]
    assert config_fingerprint(tiny_config([*SASREC, *before])) == "0cb099397fd2e82c"
    settings = ["model.query_encoder.dim=32", "model.query_encoder.dropout=0.1", *before]
    assert config_fingerprint(tiny_config([*SASREC, *settings])) == "5a941a2a6207d84f"


def jagged(histories: list[list[int]], num_candidates: int, table: torch.Tensor) -> JaggedTensor:
    """An unpooled lookup as the EmbeddingCollection returns it: query rows' items, then empty candidate rows."""
    ids = torch.tensor([i for h in histories for i in h], dtype=torch.long)
    lengths = torch.tensor([len(h) for h in histories] + [0] * num_candidates)
    return JaggedTensor(values=table[ids], lengths=lengths)


def test_padded_history_layout():
    table = torch.arange(10, dtype=torch.float32)[:, None].repeat(1, 3)  # row i = [i, i, i]
    items, lengths = padded_history(jagged([[4, 5, 6], [], [7]], 2, table), 3, 4)
    assert items.shape == (3, 4, 3) and lengths.tolist() == [3, 0, 1]
    assert items[:, :, 0].tolist() == [[4, 5, 6, 0], [0, 0, 0, 0], [7, 0, 0, 0]]


def test_forward_backward_shapes():
    torch.manual_seed(0)
    encoder = SequenceEncoder(16, 6, num_layers=2, num_heads=2, dropout=0.2)
    table = torch.randn(30, 16, requires_grad=True)
    items, lengths = padded_history(jagged([[1, 2, 3], [], [4, 5, 6, 7, 8, 9], [10]], 5, table), 4, 6)
    out = encoder(items, lengths)
    assert out.shape == (4, 16) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert torch.isfinite(table.grad).all() and table.grad[[1, 4, 10]].abs().sum() > 0
    assert table.grad[[0, 11]].abs().sum() == 0  # rows no history holds get no gradient
    assert encoder.empty.grad.abs().sum() > 0  # the user without history
    assert all(torch.isfinite(p.grad).all() for p in encoder.parameters() if p.grad is not None)
    assert encoder(items[:0], lengths[:0]).shape == (0, 16)  # candidate-only batches


def test_padding_does_not_change_the_query():
    torch.manual_seed(1)
    encoder = SequenceEncoder(8, 12, num_layers=2, num_heads=2, dropout=0.2).eval()
    table = torch.randn(30, 8)
    histories = [[3, 1, 4, 1, 5], [], [9], [2, 6, 5, 3, 5, 8, 9]]
    outs = [encoder(*padded_history(jagged(histories, 3, table), 4, length)) for length in (7, 9, 12)]
    for other in outs[1:]:
        torch.testing.assert_close(other, outs[0], rtol=1e-5, atol=1e-6)
    # whatever the padding holds: masked positions never reach a real one
    items, lengths = padded_history(jagged(histories, 0, table), 4, 12)
    noisy = items + torch.randn_like(items) * (torch.arange(12)[None, :, None] >= lengths[:, None, None])
    torch.testing.assert_close(encoder(noisy, lengths), outs[0], rtol=1e-5, atol=1e-6)


def test_tiny_loo_run_beats_popularity_and_evaluate_reproduces_it(tmp_path, data_root, process_group):
    from recsys.evaluate import EvaluateConfig, evaluate_run
    from recsys.export import export_run
    from recsys.job.run import fit

    run_dir = tmp_path / "run"
    cfg = tiny_config([f"data.root={data_root}", *SASREC])
    results = fit(cfg, run_dir)
    two_tower, popularity = results["test"]["two_tower"]["recall@20"], results["test"]["popularity"]["recall@20"]
    assert two_tower > 1.15 * popularity, (two_tower, popularity)
    assert results["dataset"]["protocol"] == "loo"

    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")
    evaluate_run(
        EvaluateConfig(run_dir=str(run_dir), ann_kinds=[], rankers=[], ks=[10, 20, 50], out_dir=str(tmp_path / "eval"))
    )
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    for split in ("valid", "test"):
        for name, value in results[split]["two_tower"].items():
            assert value == pytest.approx(report["splits"][split]["metrics"]["two_tower"][name], rel=1e-6, abs=1e-9)

    # the bundle serves the run's test ranking: each user's latest items through the exported encoder
    bundle_dir = export_run(ExportConfig(run_dir=str(run_dir)))
    bundle = load_bundle(bundle_dir)
    assert json.loads((bundle_dir / "manifest.json").read_text())["ranker"] == results["headline"]["ranker"]
    run_users, run_topk = served_ranking(run_dir)
    data, _, _, _ = load_trained(cfg, run_dir, "", process_group)
    builder = FeatureBuilder(data, cfg.data.history_length, **query_layout(cfg))
    users, _, _, timeline = Evaluator(data, builder, ks=[20], batch_size=64, chunk_size=64).protocol("test")
    lengths, items = latest_items(timeline, users, data.num_users, len(timeline))  # every item before the test one
    histories = np.split(items, np.cumsum(lengths)[:-1])
    ids, _ = bundle.recommend_batch(histories, 20, user_ids=users if bundle.reads_users else None)
    assert np.array_equal(run_users, users) and np.array_equal(ids, run_topk[:, :20])


def test_resume_continues_the_uninterrupted_run(tmp_path, data_root, process_group):
    """The sequence table's rows and fused optimizer state and the encoder's weights go through the DCP checkpoint:
    two epochs in two trainings follow one training of two epochs (no dropout: the RNG is not checkpointed)."""
    from recsys.job.run import fit

    common = [f"data.root={data_root}", *SASREC, "model.query_encoder.dropout=0", "trainer.max_steps_per_epoch=4"]
    common += ["trainer.log_every_steps=1", "trainer.early_stopping_patience=0"]
    fit(tiny_config([*common, "trainer.epochs=2"]), tmp_path / "whole")
    fit(tiny_config([*common, "trainer.epochs=1"]), tmp_path / "parts")
    fit(tiny_config([*common, "trainer.epochs=2"]), tmp_path / "parts")

    def losses(run_dir):
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"]) for r in records if "loss" in r]

    whole, parts = losses(tmp_path / "whole"), losses(tmp_path / "parts")
    assert [s for s, _ in whole] == [s for s, _ in parts] and len(whole) == 8
    np.testing.assert_allclose([v for _, v in parts], [v for _, v in whole], rtol=1e-5)


@pytest.mark.parametrize("user_id", [True, False], ids=["user_id", "sequence_alone"])
def test_two_tower_reads_the_sequence_before_its_pooled_query_columns(user_id):
    """Unsharded (the tables materialised on the CPU): shapes, and gradients reach the sequence table, not the
    item table's query rows (the item key's query rows are empty)."""
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    from recsys.data.features import build_kjt
    from recsys.data.layout import feature_layout
    from recsys.model.two_tower import TwoTower, table_configs

    num_rows = {"user": 5, "item": 9} if user_id else {"item": 9}
    configs = table_configs(num_rows=num_rows, dims={"user": 4, "item": 6}, poolings={"user": "sum", "item": "mean"})
    sequence = EmbeddingConfig(name="sequence", num_embeddings=9, embedding_dim=8, feature_names=["sequence"])
    torch.manual_seed(0)
    model = TwoTower(
        configs,
        query_tables=feature_layout(history_length=3, has_categories=False, user_id=user_id, sequence=True).tower_keys(
            "query"
        ),
        candidate_tables=["item"],
        tower_dims=[7],
        sequence_table=sequence,
        sequence_encoder=SequenceEncoder(8, 3, num_layers=1, num_heads=2, dropout=0.0),
    )
    model.ebc, model.ec = EmbeddingBagCollection(tables=configs), EmbeddingCollection(tables=[sequence])
    # 2 queries (histories [1, 2], []) and 3 candidates
    lengths = {
        "user": np.array([1, 1, 0, 0, 0]),
        "item": np.array([0, 0, 1, 1, 1]),
        "sequence": np.array([2, 0, 0, 0, 0]),
    }
    values = {"user": np.array([3, 4]), "item": np.array([5, 6, 7]), "sequence": np.array([1, 2])}
    keys = [*num_rows, "sequence"]
    queries, candidates = model(build_kjt(keys, lengths, values), 2)
    assert queries.shape == (2, 7) and candidates.shape == (3, 7)
    torch.testing.assert_close(queries.norm(dim=1), torch.ones(2))
    (queries @ candidates.T).sum().backward()
    sequence_grad = model.ec.embeddings["sequence"].weight.grad
    assert sequence_grad[[1, 2]].abs().sum() > 0 and sequence_grad[[0, 3]].abs().sum() == 0
    assert model.ebc.embedding_bags["item"].weight.grad[[1, 2]].abs().sum() == 0
