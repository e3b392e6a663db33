"""The search space: each knob of ``tune.space`` (recsys/config/tune.py) as an Optuna suggestion."""

from __future__ import annotations

from typing import Any

from recsys.config import KnobConfig, value_at


def suggest(trial, knob: KnobConfig) -> Any:
    """A value of ``knob`` drawn by an Optuna ``trial`` (the knob's key names the parameter)."""
    if knob.kind == "choice":
        return trial.suggest_categorical(knob.key, list(knob.choices))
    if knob.kind == "int":
        return trial.suggest_int(knob.key, int(knob.low), int(knob.high))
    return trial.suggest_float(knob.key, float(knob.low), float(knob.high), log=knob.kind == "log")


def describe(knob: KnobConfig) -> str:
    """``model.loss.temperature: log [0.03, 0.3]``: a knob as the run's log and the trials table state it."""
    if knob.kind == "choice":
        return f"{knob.key}: one of {list(knob.choices)}"
    return f"{knob.key}: {knob.kind} [{knob.low:g}, {knob.high:g}]"


def contains(knob: KnobConfig, value: Any) -> bool:
    """Whether ``value`` is one the knob can propose (a choice of it, or inside [low, high])."""
    if knob.kind == "choice":
        return value in list(knob.choices)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return knob.low <= value <= knob.high and (knob.kind != "int" or float(value).is_integer())


def configured(cfg, space: list[KnobConfig]) -> dict[str, Any]:
    """The config's own values of the knobs that can propose them: the search's first trial, so that the settings
    a run would train without a search are always among those ranked (a knob whose value is outside its range is
    left to the sampler)."""
    return {k.key: value_at(cfg, k.key) for k in space if contains(k, value_at(cfg, k.key))}
