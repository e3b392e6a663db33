"""``recsys.export``'s assembly: a trained run's weights loaded on this job's ranks (``recsys.job.trained.load_trained``), the
served ranker the evaluation stage kept (``<run dir>/served/``) with the query encoder only the weights give, written
as the serving bundle (recsys/serving/bundle_writer.py; its layout: recsys/serving/bundle.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

from recsys.config import ExportConfig, IdMapping, ModelConfig
from recsys.data.layout import FeatureLayout
from recsys.distributed.collectives import full_tables
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.distributed.managed import full_id_maps, zero_miss_rows
from recsys.job.checks import check_exportable, check_index_kind, export_stage_dir
from recsys.job.trained import REFIT_DIR, load_trained, reading_run
from recsys.rankers.parts import BundleRun
from recsys.rankers.plugins import load_plugins
from recsys.rankers.served import Served
from recsys.rankers.served_dir import SERVED_DIR, load_served
from recsys.rankers.two_tower.query_encoder import QueryEncoder
from recsys.rankers.two_tower.weights import served_from_weights
from recsys.rundir.config import load_run_config
from recsys.serving.bundle_writer import RunRecord, check_replaceable, encoder_entry, write_bundle

log = logging.getLogger(__name__)


def query_encoder(model: ModelConfig, layout: FeatureLayout, tables: dict, two_tower) -> QueryEncoder:
    """The two-tower's query side as the bundle serves it: unsharded tables (``full_tables``) and the tower."""
    sequence_encoder = two_tower.sequence_encoder
    return QueryEncoder(
        tables,
        {t: c.pooling for t, c in model.tables.items()},
        two_tower.query_tower.cpu(),
        layout.tower_specs("query"),
        item_bias=model.uses_item_bias,
        sequence_encoder=None if sequence_encoder is None else sequence_encoder.cpu(),
        blend_user=two_tower.blend_key is not None,
    ).eval()


def _served_ranker(run_dir: Path, checkpoint: str) -> tuple[Served, dict] | None:
    """(the headline ranker as the evaluation stage fit it for test, its point) from ``<run dir>/served/``, or None:
    the model's weights alone (``checkpoint`` names other weights, or the run has no served/)."""
    if not checkpoint and (run_dir / SERVED_DIR).is_dir():
        served, meta = load_served(run_dir)
        log.info(
            "serving bundle of %s (%s, fit on %s), as the run ranked test",
            meta["ranker"],
            meta["point_key"],
            meta["fit_on"],
        )
        return served, meta["point"]
    why = "checkpoint=" + checkpoint if checkpoint else f"no {SERVED_DIR}/ in {run_dir}"
    log.info("serving bundle of the trained model alone (%s)", why)
    return None


def export_run(ecfg: ExportConfig) -> Path:
    """Collective: the serving bundle of a trained run (recsys/serving/bundle.py), written by rank 0; returns its path.

    The bundle serves the run's headline ranker as its evaluation stage fit it for test (``<run dir>/served/``), of
    the refit where the run has one (``stage=selection``: the run's own); ``checkpoint=PATH`` (other weights than the
    best epoch's), or a run without served/, exports the two-tower alone; refused while a training runs there.
    """
    with reading_run(Path(ecfg.run_dir)):  # every rank, before anything is read or written
        return _export_run(ecfg)


def _export_run(ecfg: ExportConfig) -> Path:
    run_dir = Path(ecfg.run_dir)
    out = Path(ecfg.out_dir) if ecfg.out_dir else run_dir / "export"
    check_index_kind(ecfg.index)
    check_replaceable(out)  # before any work, on every rank
    run_dir = export_stage_dir(run_dir, ecfg.checkpoint, REFIT_DIR, ecfg.stage)  # a trainer.refit run: its refit
    cfg = load_run_config(run_dir, ecfg.checkpoint)
    load_plugins(
        cfg.eval.plugins
    )  # the run's plug-in rankers and their served parts, as train and evaluate import them
    check_exportable(cfg, run_dir)
    chosen = _served_ranker(run_dir, ecfg.checkpoint)
    env = init_distributed(ecfg.device)  # this machine's device, not necessarily the training run's
    trained = None
    try:
        # the bundle needs the items and the vocabularies, no interactions: each rank reads only its users'
        trained = load_trained(cfg, run_dir, ecfg.checkpoint, env, whole_data=False)
        data, layout, model = trained.data, trained.layout, trained.sharded.two_tower
        model.eval()
        served, point = chosen or (served_from_weights(layout, data, model, env, ecfg.batch_size), {})
        if cfg.model.id_mapping == IdMapping.managed:
            zero_miss_rows(trained.sharded.module)  # the shared row of unheld ids, as every lookup sees it
        tables = full_tables(trained.sharded.module, env.rank, env.device)
        id_maps = None
        if cfg.model.id_mapping == IdMapping.managed:  # the bundle maps raw ids to the tables' rows itself
            id_maps = full_id_maps(trained.sharded.module, env.rank, env.world_size)
        if env.is_main:
            entry = encoder_entry(cfg.model, layout, data)
            run = BundleRun(lambda: query_encoder(cfg.model, layout, tables, model), entry, id_maps)
            record = RunRecord(
                checkpoint=trained.checkpoint,
                trained_on="train + valid" if cfg.data.train_on_valid else "train",
                config_yaml=OmegaConf.to_yaml(OmegaConf.structured(cfg)),
            )
            write_bundle(out, served.for_bundle(run), point, data, record, index=ecfg.index)
            log.info("serving bundle: %s", out)
        return out
    finally:
        del trained
        destroy_distributed(env)
