"""Which rankers a run (or recsys.evaluate's report) ranks and serves, decided from the run's config: the default list
by the data's query and catalogue, the serve candidates, and the checks of the names, settings and resources before any
work. The run's plan (recsys/job/plan.py) holds what these decide; the rankers themselves (recsys/rankers/) know no
root config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from data_pipelines.errors import ConfigError
from recsys.config import Config, IdMapping, QueryHistory
from recsys.rankers.registry import (
    DEFAULT_EASE_MAX_ITEMS,
    DEFAULT_FUSION,
    EASE_FUSION,
    REPORT_BASELINES,
    REPORT_OWN,
    SETTINGS,
    TRAINED,
    check_ranker_names,
    is_servable,
    ranker_specs,
    served_parts,
    settings_of,
    used_specs,
)
from recsys.rankers.resources import Resources


def resolved_rankers(cfg: Config, num_items: int | None = None) -> list[str]:
    """``eval.rankers``, or when null: the two-tower and popularity, and where the query is a profile bag (the
    random-split protocols: held-out items anywhere in the user's profile, the graph filter's and EASE's own setting)
    with the vocabulary's ids, outside data.slices, the two-tower fused with the graph filter, and with EASE too on a
    catalogue of up to ``DEFAULT_EASE_MAX_ITEMS`` items (``num_items``; None: not known yet, the widest list, for
    checks); the run logs what this gave (recsys.job.run)."""
    if cfg.eval.rankers is not None:
        return list(cfg.eval.rankers)
    # not with managed ids, nor data.slices (nothing held out to tune its grid on): docs/continuous-training.md
    fused = (
        cfg.data.query_history == QueryHistory.profile
        and cfg.model.id_mapping == IdMapping.vocab
        and not cfg.data.slices
    )
    small = num_items is None or num_items <= DEFAULT_EASE_MAX_ITEMS
    return [TRAINED, "popularity"] + ([DEFAULT_FUSION] if fused else []) + ([EASE_FUSION] if fused and small else [])


def report_rankers(cfg: Config, asked: Sequence[str] | None, num_items: int | None = None) -> list[str]:
    """The rankers recsys.evaluate ranks through the evaluation stage: ``asked`` (its rankers=), else the run's
    eval.rankers (of a catalogue of ``num_items``) and ``REPORT_BASELINES``, without the row the report ranks itself
    (the two-tower's); the report adds popularity, its floor, to any list."""
    names = list(asked) if asked is not None else [*resolved_rankers(cfg, num_items), *REPORT_BASELINES]
    return [name for name in dict.fromkeys(names) if name not in REPORT_OWN]


def report_defaults(cfg: Config, asked: Sequence[str] | None, num_items: int | None = None) -> list[str]:
    """The report's rankers from a default list, which its cost plan may lower or leave out (recsys/rankers/stage_cost.py):
    with its rankers=null the baselines, and the run's own where its eval.rankers was null too; none when asked."""
    if asked is not None:
        return []
    own = resolved_rankers(cfg, num_items) if cfg.eval.rankers is None else []
    listed = set(cfg.eval.rankers or ())
    return [n for n in report_rankers(cfg, None, num_items) if n in own or (n in REPORT_BASELINES and n not in listed)]


def serve_candidates(cfg: Config, num_items: int | None = None) -> list[str]:
    """The rankers the headline and the bundle are chosen from, in order: ``eval.serve``, else every servable one of
    the resolved rankers (the evaluation stage serves the best on valid: ``recsys.evaluation.stage``)."""
    if cfg.eval.serve:
        return [cfg.eval.serve]
    names = [n for n in resolved_rankers(cfg, num_items) if n.split("+")[0] in ranker_specs() and is_servable(n)]
    return names or [TRAINED]


def served_ranker(cfg: Config) -> str:
    """The ranker served without a valid split to choose on: ``eval.serve``, else the last servable one listed."""
    return serve_candidates(cfg)[-1]


def check_rankers(cfg: Config) -> None:
    """The rankers before any work: known names, their settings' types and rules (each ranker's package), the served
    one among them and servable; one ConfigError naming every key that is wrong."""
    names, serve = resolved_rankers(cfg), served_ranker(cfg)
    check_ranker_names(names)
    problems: list[str] = []

    def need(ok: bool, key: str, value: Any, rule: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: {rule}")

    need(TRAINED in names, "eval.rankers", names, f"must list {TRAINED} (what was trained)")
    servable_names = [n for n in names if is_servable(n)]
    need(
        serve in servable_names,
        "eval.serve",
        serve,
        f"must be one of eval.rankers' servable ones ({', '.join(servable_names)})",
    )
    for name, spec in used_specs(names).items():
        try:
            settings = settings_of(name, cfg.eval.settings, {name: spec})
        except ConfigError as e:
            problems.append(str(e))
            continue
        if spec.check is not None:
            spec.check(settings, need, f"{SETTINGS}.{name}")
    if problems:
        raise ConfigError("bad config values: " + "; ".join(problems))


def check_resources(cfg: Config, resources: Resources) -> None:
    """Refuse (ConfigError) a ranker whose fit the host cannot hold: each used ranker's resource check."""
    names = resolved_rankers(cfg, resources.num_items)
    resources = replace(resources, served_parts=served_parts(names, cfg.eval.serve))
    for name, spec in used_specs(names).items():
        if spec.resources is not None:
            why = spec.resources(settings_of(name, cfg.eval.settings, {name: spec}), resources, f"{SETTINGS}.{name}")
            if why:
                raise ConfigError(why)
