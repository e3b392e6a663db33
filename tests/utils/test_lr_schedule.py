"""optim.schedule: the learning rates of the tables (fbgemm's fused optimizer) and of the towers follow
the schedule, epoch for epoch, also in a refit whose epochs have more steps."""

from __future__ import annotations

import json

import pytest
import torch

from recsys.job.run import fit
from recsys.utils.lr_schedule import LrSchedule, lr_factor
from tests.helpers.config import tiny_config


def test_linear_factor_falls_to_zero_at_the_horizon_and_stays_there():
    assert [lr_factor("linear", p, 4) for p in (0, 1, 2, 3, 4, 5)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert lr_factor("constant", 7.5, 4) == 1.0
    with pytest.raises(ValueError, match="optim.schedule='cosine': expected one of constant, linear"):
        lr_factor("cosine", 0, 4)


def test_schedule_scales_every_group_from_its_configured_rate():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.002}])
    schedule = LrSchedule(opt, "linear", horizon_epochs=10)
    opt.param_groups[0]["lr"] = 123.0  # what loading a checkpoint does: its saved rate must not become the base
    assert schedule.apply(2.5) == 0.75
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.075, 0.0015])


def table_learning_rates(sharded) -> list[float]:
    """The rates fbgemm's table-batched kernels hold (what the fused backward updates rows with)."""
    rates = []
    for module in sharded.module.modules():
        for lookup in getattr(module, "_lookups", []):
            for emb in getattr(lookup, "_emb_modules", []):
                rates.append(float(emb._emb_module.get_learning_rate()))
    return rates


def test_tables_and_towers_follow_the_linear_schedule(tmp_path, data_root, process_group, monkeypatch):
    import recsys.training.trainer as trainer_module

    seen = {}
    original = trainer_module.Trainer.train_epoch

    def train_epoch(self):
        original(self)
        seen[self.state.epoch] = (
            table_learning_rates(self.sharded),
            [g["lr"] for g in self.sharded.optimizer.param_groups],
        )

    monkeypatch.setattr(trainer_module.Trainer, "train_epoch", train_epoch)
    cfg = tiny_config(
        [
            f"data.root={data_root}",
            "trainer.epochs=2",
            "trainer.max_steps_per_epoch=5",
            "trainer.log_every_steps=1",
            "optim.schedule=linear",
        ]
    )
    fit(cfg, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    factors = [r["lr_factor"] for r in records if "lr_factor" in r]
    # before step i of 10 (2 epochs of 5): 1 - i / 10
    assert factors == pytest.approx([1 - i / 10 for i in range(10)])
    sparse_lr, dense_lr = cfg.optim.sparse.lr, cfg.optim.dense.lr
    tables, groups = seen[0]
    assert tables and all(r == pytest.approx(sparse_lr * 0.6, rel=1e-6) for r in tables)  # set at step 4's step()
    assert sorted(groups) == pytest.approx(sorted([sparse_lr * 0.6, dense_lr * 0.6]))
    tables, _ = seen[1]
    assert all(r == pytest.approx(sparse_lr * 0.1, rel=1e-6) for r in tables)


def test_unknown_schedule_is_refused_before_any_work():
    with pytest.raises(ValueError, match="optim.schedule='cosine': expected one of constant, linear"):
        tiny_config(["optim.schedule=cosine"])


def test_refit_replays_the_selection_stages_horizon():
    """The refit trains best epoch + 1 epochs: its rates must follow the selection's curve over those
    epochs, not fall to zero over its own shorter run."""
    from recsys.job.run import refit_config

    cfg = tiny_config(["optim.schedule=linear", "trainer.epochs=6"])
    refit = refit_config(cfg, best_epoch=2)
    assert (refit.trainer.epochs, refit.optim.schedule_epochs) == (3, 6)
    explicit = refit_config(tiny_config(["optim.schedule=linear", "optim.schedule_epochs=9"]), best_epoch=2)
    assert explicit.optim.schedule_epochs == 9
