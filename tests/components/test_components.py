"""Losses and query encoders are components (recsys/components/registry.py): chosen by name, their settings a section of
their own that refuses what the chosen one lacks, a new one is its module (and YAML) alone, and a run dir written
while their settings were flat model fields (the losses') or a name and a sasrec section (the query encoders') still
reads as the same component."""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace

import pytest
import torch
from omegaconf import OmegaConf

from data_pipelines.errors import ConfigError
from recsys.components.losses import PACKAGE as LOSSES
from recsys.components.query_encoders import PACKAGE as QUERY_ENCODERS
from recsys.components.registry import component_configs, to_component
from recsys.config import Config, check_values, schema
from recsys.rundir.saved_config import nest_flat_loss, nest_query_encoder
from tests.helpers.config import tiny_config


def test_each_loss_is_chosen_by_name_with_its_own_settings():
    cfg = tiny_config(["model/loss=ccl", "model.loss.margin=0.5"])
    assert type(cfg.model.loss).__module__ == "recsys.components.losses.ccl"
    assert (cfg.model.loss.margin, cfg.model.loss.negative_weight) == (0.5, 150.0)
    softmax = tiny_config(["model.loss.temperature=1"]).model.loss
    assert softmax.temperature == 1.0 and isinstance(softmax.temperature, float)
    assert Config().model.loss == component_configs(LOSSES)["softmax"]()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"name": "softmax", "margin": 0.5}, r"model.loss.margin: not a setting of model.loss.name=softmax"),
        ({"name": "bpr"}, r"model.loss.name='bpr': expected one of ccl, softmax"),
        ({"name": "softmax", "temperature": "hot"}, r"model.loss.temperature='hot': expected a float"),
        ({"name": "ccl", "negative_weight": True}, r"model.loss.negative_weight=True: expected a float"),
        ("softmax", r"model.loss='softmax': expected a section with a name"),
    ],
)
def test_a_setting_the_chosen_loss_lacks_is_refused_by_its_path(section, message):
    with pytest.raises(ConfigError, match=message):
        to_component(section, LOSSES, "model.loss")


def test_a_new_loss_is_its_module_alone(tmp_path, monkeypatch):
    """A module in the losses package with a Config and a build(): found by name, no registration anywhere."""
    package = tmp_path / "extra"
    package.mkdir()
    (package / "scaled_ccl.py").write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass
            from recsys.components.losses.ccl import CosineContrastive, Config as CclConfig

            @dataclass
            class Config:
                name: str = "scaled_ccl"
                scale: float = 2.0

                def check(self, need, key):
                    need(self.scale > 0, f"{key}.scale", self.scale, "must be > 0")

                def build(self):
                    ccl = CosineContrastive(CclConfig())
                    return lambda *a, **kw: self.scale * ccl(*a, **kw)
            """
        )
    )
    import recsys.components.losses as losses

    monkeypatch.setattr(losses, "__path__", [*losses.__path__, str(package)])
    component_configs.cache_clear()
    try:
        base = tiny_config([])
        cfg = replace(base, model=replace(base.model, loss={"name": "scaled_ccl", "scale": 3}))
        assert cfg.model.loss.scale == 3.0
        with pytest.raises(ValueError, match=r"model.loss.scale=-1.0: must be > 0"):
            check_values(replace(base, model=replace(base.model, loss={"name": "scaled_ccl", "scale": -1})))
        q = torch.nn.functional.normalize(torch.randn(4, 3), dim=1)
        args = dict(
            labels=torch.arange(4), query_item_ids=torch.arange(4), candidate_item_ids=torch.arange(4), unit_dims=3
        )
        plain = component_configs(LOSSES)["ccl"]().build()(q, q, **args, log_q=None)
        assert cfg.model.loss.build()(q, q, **args, log_q=None) == pytest.approx(3 * plain.item())
    finally:
        component_configs.cache_clear()
        sys.modules.pop("recsys.components.losses.scaled_ccl", None)


@pytest.mark.parametrize(
    ("flat", "section"),
    [
        (
            {"loss": "softmax", "temperature": 0.2, "logq_correction": False, "logq_weight": 1.0, "margin": 0.9,
             "negative_weight": 150.0, "softmax_block_mb": 8},
            {"name": "softmax", "temperature": 0.2, "logq_correction": False, "logq_weight": 1.0, "block_mb": 8},
        ),
        (
            {"loss": "ccl", "temperature": 0.1, "logq_correction": True, "logq_weight": 1.0, "margin": 0.4,
             "negative_weight": 10.0, "softmax_block_mb": -1},
            {"name": "ccl", "margin": 0.4, "negative_weight": 10.0},
        ),
    ],
)  # fmt: skip
def test_an_older_runs_flat_loss_fields_read_as_the_same_loss(flat, section):
    saved = OmegaConf.create({"model": {"tower_dims": [8], **flat}})
    nest_flat_loss(saved)
    assert OmegaConf.to_container(saved.model) == {"tower_dims": [8], "loss": section}
    merged = OmegaConf.merge(schema(Config), saved)
    assert OmegaConf.to_container(merged.model.loss) == section


def test_each_query_encoder_is_chosen_by_name_and_says_what_it_reads():
    """The layout follows the Config's ``sequence``, not its name."""
    from recsys.config import query_layout

    sasrec = tiny_config(["model/query_encoder=sasrec", "data/protocol=loo", "model.query_encoder.dim=8"])
    assert type(sasrec.model.query_encoder).__module__ == "recsys.components.query_encoders.sasrec"
    assert (sasrec.model.query_encoder.dim, sasrec.model.query_encoder.num_layers) == (8, 2)
    assert sasrec.model.query_encoder.sequence and query_layout(sasrec)["sequence"]
    bag = tiny_config([])
    assert bag.model.query_encoder == component_configs(QUERY_ENCODERS)["bag"]() == Config().model.query_encoder
    assert not bag.model.query_encoder.sequence and not query_layout(bag)["sequence"]
    assert bag.model.query_encoder.build(10) is None  # the bag is the item table's pooled lookup
    encoder = sasrec.model.query_encoder.build(5)
    assert encoder.max_length == 5 and encoder(torch.zeros(3, 5, 8), torch.tensor([0, 2, 5])).shape == (3, 8)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"name": "bag", "dim": 8}, r"model.query_encoder.dim: not a setting of model.query_encoder.name=bag \(its settings: none\)"),
        ({"name": "gru"}, r"model.query_encoder.name='gru': expected one of attention, bag, gated, sasrec"),
        ({"name": "sasrec", "num_layers": 1.5}, r"model.query_encoder.num_layers=1.5: expected a int"),
        ("sasrec", r"model.query_encoder='sasrec': .*choose one with model/query_encoder=NAME"),
    ],
)  # fmt: skip
def test_a_setting_the_chosen_query_encoder_lacks_is_refused_by_its_path(section, message):
    with pytest.raises(ConfigError, match=message):
        to_component(section, QUERY_ENCODERS, "model.query_encoder")


@pytest.mark.parametrize(
    ("flat", "section"),
    [
        (
            {"query_encoder": "bag", "sasrec": {"dim": 64, "num_layers": 2, "num_heads": 1, "dropout": 0.2}},
            {"name": "bag"},
        ),
        (
            {"query_encoder": "sasrec", "sasrec": {"dim": 32, "num_layers": 1, "num_heads": 2, "dropout": 0.0}},
            {"name": "sasrec", "dim": 32, "num_layers": 1, "num_heads": 2, "dropout": 0.0},
        ),
        ({}, None),  # from before model.query_encoder: the schema's default, the bag
    ],
)  # fmt: skip
def test_an_older_runs_query_encoder_name_and_sasrec_section_read_as_the_same_encoder(flat, section):
    saved = OmegaConf.create({"model": {"tower_dims": [8], **flat}})
    nest_query_encoder(saved)
    expected = {"tower_dims": [8]} | ({"query_encoder": section} if section else {})
    assert OmegaConf.to_container(saved.model) == expected
    merged = OmegaConf.merge(schema(Config), saved)
    assert OmegaConf.to_container(merged.model.query_encoder) == (section or {"name": "bag"})


def test_a_run_whose_query_encoder_the_bundle_cannot_serve_says_so(data_root, tmp_path, process_group):
    """results.json and its table mark the two-tower and its fusions not servable, with the reason export gives."""
    from recsys.job.run import fit
    from recsys.rundir.outputs import format_results_table

    # managed ids with the history pooled through the neighbour table too (the tiny data has neighbours)
    managed = ["model.id_mapping=managed", "model.managed.zch_size.user=512", "model.managed.zch_size.item=512"]
    cfg = tiny_config([f"data.root={data_root}", "trainer.epochs=1", *managed])
    results = fit(cfg, tmp_path)
    assert results["headline"]["servable"] is False
    assert "cannot be exported yet" in results["headline"]["not_servable"]
    assert not any(row["servable"] for name, row in results["rankers"].items() if name.startswith("two_tower"))
    assert "headline, not exportable" in format_results_table(results, [20])
