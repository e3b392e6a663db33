"""What a run says about its inputs before it reports, so that no figure or file surprises:

- a given split's rows that prepare dropped (``data.protocol=given``: unknown users / items, pairs
  already in train, duplicates), on the console and in train.log (results.json has them too);
- a cut-off ``k`` at or beyond the catalogue, where every item is in the top k (Recall@k is 1 by
  construction);
- which stage of a ``trainer.refit`` run ``recsys.export`` exports, and how to export the other;
- a run whose query encoder the serving bundle cannot serve yet, refused before ``recsys.export`` loads it;
- a global batch larger than the training examples, refused before the model is built;
- names the entry points take (an index kind, ANN kinds, splits, the run's rankers), refused before any loading.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from data_pipelines.dataset_dir import dropped_rows_report, read_meta
from data_pipelines.errors import ConfigError
from recsys.config import Config, query_not_exportable
from recsys.job.ranker_choice import report_rankers
from recsys.rankers.registry import check_ranker_names
from recsys.utils.choices import ANN_KINDS
from recsys.utils.refusals import RunRefused

__all__ = [
    "check_batch_fits",
    "check_evaluate_names",
    "check_exportable",
    "check_index_kind",
    "export_stage_dir",
    "note_dropped_rows",
    "warn_ks_beyond_catalogue",
]

log = logging.getLogger(__name__)


def check_batch_fits(global_batch_size: int, num_examples: int, dataset_dir: Path) -> None:
    """One global batch must fit in an epoch's training examples (summed over ranks), or a refusal saying what fits."""
    if num_examples < global_batch_size:
        raise ConfigError(
            f"trainer.global_batch_size={global_batch_size}: more than the {num_examples} training examples of "
            f"{dataset_dir} (an epoch is at least one batch); lower it: trainer.global_batch_size={max(num_examples, 1)} "
            "or less, or bring more rows"
        )


def check_index_kind(index: str) -> None:
    """recsys.export's ``index``: a FAISS index kind the bundle can be written with."""
    if index not in ANN_KINDS:
        raise ConfigError(
            f"index={index}: choose one of {', '.join(ANN_KINDS)} (the FAISS index written with the bundle)"
        )


def check_evaluate_names(
    ann_kinds: Sequence[str], splits: Sequence[str], cfg: Config, asked: Sequence[str] | None = None
) -> None:
    """recsys.evaluate's names, before anything loads: its ANN kinds and splits, and the rankers it ranks (``asked``,
    its rankers=, else the run's eval.rankers and the report's baselines; a plug-in's must be registered in this
    process too: eval.plugins)."""
    unknown = [kind for kind in ann_kinds if kind not in ANN_KINDS]
    if unknown:
        raise ConfigError(
            f"ann_kinds={list(ann_kinds)}: {', '.join(unknown)} unknown; choose from {', '.join(ANN_KINDS)}"
        )
    bad = [split for split in splits if split not in ("valid", "test")]
    if bad:
        raise ConfigError(f"splits={list(splits)}: {', '.join(bad)} is not evaluated; choose from valid, test")
    check_ranker_names(report_rankers(cfg, asked))


def note_dropped_rows(dataset_dir: Path) -> None:
    """Log the given split's dropped rows (meta.json ``given_split.dropped``); nothing for other protocols."""
    for line in dropped_rows_report(read_meta(dataset_dir)):
        log.info("%s", line)


def warn_ks_beyond_catalogue(ks: Sequence[int], num_items: int, setting: str) -> None:
    """Warn of each cut-off ``k >= num_items``: the top k holds every item, so its recall says nothing."""
    beyond = [k for k in ks if k >= num_items]
    if beyond:
        log.warning(
            "%s=%s: k=%s is not below the catalogue's %d items: the top k holds every item, so Recall@k is 1 "
            "(and NDCG@k near it) by construction, whatever the model; choose cut-offs below %d",
            setting,
            list(ks),
            ", ".join(map(str, beyond)),
            num_items,
            num_items,
        )


EXPORT_STAGES = ("auto", "selection")


def export_stage_dir(run_dir: Path, checkpoint: str, refit_dir: str, stage: str) -> Path:
    """The run dir whose weights ``recsys.export`` bundles: a ``trainer.refit`` run's refit (``<run dir>/<refit_dir>``,
    whose test figures are the run's answer) unless ``stage=selection`` or a checkpoint is named; says which, and how
    to export the other stage."""
    if stage not in EXPORT_STAGES:
        raise RunRefused(f"stage={stage!r}: expected one of {', '.join(EXPORT_STAGES)}")
    say = log.info if int(os.environ.get("RANK", "0")) == 0 else log.debug  # one rank says it
    has_refit = (run_dir / refit_dir / "checkpoints").is_dir()
    if not checkpoint and has_refit and stage == "auto":
        say(
            '%s: exporting the refit %s (trained on train + valid: results.json\'s "refit" figures); stage=selection '
            "exports the selection stage (train only)",
            run_dir,
            run_dir / refit_dir,
        )
        return run_dir / refit_dir
    if not checkpoint and has_refit:
        say(
            "%s: exporting the selection stage (trained on train only; checkpoints/best), as stage=selection asks",
            run_dir,
        )
    elif not checkpoint and run_dir.name == refit_dir and (run_dir.parent / "checkpoints").is_dir():
        say(
            "%s: exporting the refit (trained on train + valid); run_dir=%s stage=selection exports the selection "
            "stage (train only)",
            run_dir,
            run_dir.parent,
        )
    return run_dir


def check_exportable(cfg: Config, run_dir: Path) -> None:
    """Refuse the runs whose query encoder the bundle cannot serve yet."""
    why = query_not_exportable(cfg)
    if why:
        raise RunRefused(f"{run_dir}: {why}; evaluate the run with python -m recsys.evaluate instead")
