"""The rankers by name: each one's package (how it is built, its settings, their rules, its resource check, its label),
the default list's names, and the checks of names and settings. Which of them a run ranks and serves is the run's
decision (recsys/job/ranker_choice.py): nothing here reads the root config.

    rankers, parts = build_rankers(["two_tower", "popularity", "two_tower+graph_filter"], context)

A name ``a+b`` is the fusion of the rankers ``a`` and ``b`` (recsys/rankers/fusion.py, with ``eval.settings.fusion``);
any other name is looked up in the registered rankers (``ranker_specs``). A ranker's settings live at
``eval.settings.<name>`` (a Hydra group ``conf/eval/rankers/<name>.yaml``), typed by its package's dataclass. A ranker
registers itself, once: a built-in one in its package's ``spec.py`` (found by recsys/rankers/builtin.py, nothing here
names it), a plug-in in its module (``eval.plugins``); a servable one's ``part.py`` registers its part
(recsys/rankers/parts.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data_pipelines.errors import ConfigError
from recsys.config import EvalConfig
from recsys.config.need import Need
from recsys.rankers import fusion
from recsys.rankers.base import Ranker
from recsys.rankers.builtin import import_builtin
from recsys.rankers.cost import RankerCost
from recsys.rankers.fusion import FusionRanker
from recsys.rankers.parts import servable
from recsys.rankers.resources import Resources
from recsys.ranking.scoring import TRAINED_ROW

SETTINGS = "eval.settings"  # where each ranker's settings live: eval.settings.<name>
FUSION = "fusion"  # the settings of every fusion a+b
TRAINED = TRAINED_ROW  # the ranker of the trained weights: every run lists it
DEFAULT_FUSION = f"{TRAINED}+graph_filter"  # what the default list adds where the data is a profile-bag graph
EASE_FUSION = f"{TRAINED}+ease"  # and on a small catalogue, served when valid prefers it (recsys.evaluation.stage)
# the catalogues EASE joins the default list on: its 8 factorisations (7 λ on valid, 1 for test) take about 2 minutes
# on 2 CPU cores at 4,096 items, and it led the graph filter's fusion on cut-down Gowalla and Yelp2018 samples
# (docs/quality.md, "EASE in the served fusion")
DEFAULT_EASE_MAX_ITEMS = 4096
POPULARITY = "popularity"  # the floor every report ranks (recsys/rankers/popularity), through the stage as the others
# recsys.evaluate's rows beside the run's own rankers when it is not told which (its rankers=null)
REPORT_BASELINES = ("graph_filter", DEFAULT_FUSION, "ease", "ials")
REPORT_OWN = (TRAINED,)  # the row the report ranks itself (the embeddings it was given), with its breakdowns


@dataclass
class RankerContext:
    """What a ranker may be built from: the eval config, and what the run computed before the stage."""

    eval: EvalConfig
    train_counts: np.ndarray  # int64 [I]: interactions per item in the training split
    trained_on: str = "train"  # the splits the two-tower's weights were trained on
    # split name -> (its users' query embeddings [U, D], item embeddings [I, D]) of the trained two-tower
    embeddings: Mapping[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    seed: int = 0
    reduce: Callable | None = None  # sums over the ranks that hold the users' rows between them (data.shard_by_user)
    # bool [I]: items the two-tower's weights hold no row of their own for (recsys/ranking/untrained.py), left out
    unranked_items: torch.Tensor | None = None
    available_bytes: int | None = None  # memory a fit may plan with (EASE's dtype); None: measured when it fits


@dataclass(frozen=True)
class RankerSpec:
    """One ranker's package: ``build(context, settings)``; ``settings``: the dataclass of ``eval.settings.<name>``
    (None: it has none); ``check(settings, need, key)``: their rules; ``resources(settings, resources, key)``: the
    refusal of a fit the host cannot hold ("" when it can), asked before any work; ``estimate(settings, resources)``:
    what its fit and ranking cost (recsys/rankers/cost.py; None: not estimated, logged as unknown); ``label``: its name
    in the report's tables ("": the registered name)."""

    build: Callable[[RankerContext, Any], Ranker]
    settings: type | None = None
    check: Callable[[Any, Need, str], None] | None = None
    resources: Callable[[Any, Resources, str], str] | None = None
    estimate: Callable[[Any, Resources], RankerCost] | None = None
    label: str = ""


# every registered ranker by name: the built-in packages' (their spec.py, imported by ``ranker_specs`` the first time
# it is asked) and the plug-ins'
RANKERS: dict[str, RankerSpec] = {}
_builtins_imported = False
COMBINATORS: dict[str, RankerSpec] = {
    FUSION: RankerSpec(lambda c, s: s, fusion.FusionSettings, fusion.check_settings),
}


def register_ranker(
    name: str,
    build: Callable[[RankerContext, Any], Ranker],
    *,
    settings: type | None = None,
    check: Callable[[Any, Need, str], None] | None = None,
    resources: Callable[[Any, Resources, str], str] | None = None,
    estimate: Callable[[Any, Resources], RankerCost] | None = None,
    label: str = "",
) -> None:
    """Make ``name`` usable in eval.rankers (and as a part of fusions); ``build(context, settings)``. The built-in
    rankers are registered first, so that a plug-in registered under one of their names replaces it."""
    if "+" in name:
        raise ValueError(f"ranker name {name!r}: '+' joins the parts of a fusion")
    ranker_specs()[name] = RankerSpec(build, settings, check, resources, estimate, label)


def ranker_label(name: str) -> str:
    """``name`` as the report's tables show it: its package's label, a fusion's parts' joined by " + " (an unknown
    name as given)."""
    parts = name.split("+")
    if len(parts) > 1:
        return " + ".join(ranker_label(part) for part in parts)
    spec = ranker_specs().get(name)
    return (spec.label if spec is not None else "") or name


def ranker_specs() -> dict[str, RankerSpec]:
    """Every registered ranker by name; the first call imports the built-in packages' spec.py (each registers itself)."""
    global _builtins_imported
    if not _builtins_imported:
        _builtins_imported = True
        import_builtin("spec")
    return RANKERS


def settings_of(name: str, given: Mapping[str, Any], specs: Mapping[str, RankerSpec] | None = None) -> Any:
    """``name``'s settings: its dataclass's defaults with ``given[name]`` (eval.settings) over them, typed; a
    ConfigError naming ``eval.settings.<name>`` and the key when one is unknown or of the wrong type."""
    spec = (ranker_specs() if specs is None else specs)[name]  # looked up now: a plug-in may have replaced it
    if spec.settings is None:
        return None
    try:
        merged = OmegaConf.merge(OmegaConf.structured(spec.settings), given.get(name) or {})
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{SETTINGS}.{name}: {e.msg.splitlines()[0]}") from None


def is_servable(name: str) -> bool:
    """Whether the bundle can serve ``name``: every part of it has a registered servable part."""
    return all(servable(part) for part in name.split("+"))


def served_parts(names: Sequence[str], serve: str = "") -> frozenset[str]:
    """The rankers whose fits must be servable: every fusion's parts among ``names``, and ``serve``'s (a ranker named
    to be served; one chosen on valid is chosen among the servable fits only)."""
    return frozenset(
        {p for name in names if "+" in name for p in name.split("+")} | set(serve.split("+") if serve else ())
    )


def used_specs(names: Sequence[str]) -> dict[str, RankerSpec]:
    """The specs of the rankers ``names`` are built from, fusions' settings included."""
    specs = ranker_specs()
    used = {part: specs[part] for name in names for part in name.split("+") if part in specs}
    if any("+" in name for name in names):
        used[FUSION] = COMBINATORS[FUSION]
    return used


def check_ranker_names(names: Sequence[str]) -> None:
    """Refuse an unknown ranker name, naming eval.rankers and the known ones."""
    for name in names:
        for part in name.split("+"):
            if part not in ranker_specs():
                raise ConfigError(
                    f"eval.rankers: unknown ranker {part!r} in {name!r}; known: {', '.join(sorted(ranker_specs()))}, and "
                    "fusions a+b of them (a plug-in's rankers: name its module in eval.plugins)"
                )
        if name.count("+") > 1:
            raise ConfigError(f"eval.rankers: {name!r}: a fusion has two parts (a+b)")


def build_rankers(names: Sequence[str], context: RankerContext) -> tuple[list[Ranker], list[Ranker]]:
    """(the rankers ``names`` lists, in order; the parts its fusions need that it does not list)."""
    check_ranker_names(names)
    built: dict[str, Ranker] = {}
    given = context.eval.settings

    def get(name: str) -> Ranker:
        if name not in built:
            if "+" in name:
                first, second = name.split("+")
                betas = settings_of(FUSION, given, COMBINATORS).betas
                built[name] = FusionRanker(get(first), get(second), betas)
            else:
                built[name] = ranker_specs()[name].build(context, settings_of(name, given))
        return built[name]

    listed = [get(name) for name in names]
    return listed, [r for name, r in built.items() if name not in names]
