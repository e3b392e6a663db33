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
    """The config's own values of the knobs that can propose them: what the study is given as its first trial (a
    value outside its knob's range is one Optuna cannot be told of)."""
    return {k.key: value_at(cfg, k.key) for k in space if contains(k, value_at(cfg, k.key))}


def trial_values(trial, cfg, space: list[KnobConfig], number: int) -> dict[str, Any]:
    """The values trial ``number`` trains, drawn by the Optuna ``trial``. Trial 0 trains the config exactly as given,
    so that the settings a run would train without a search are always among those ranked: its knobs inside their
    ranges are suggested (the study's enqueued values, which it learns from), those outside are trained as they are,
    unknown to the sampler."""
    if number != 0:
        return {knob.key: suggest(trial, knob) for knob in space}
    inside = configured(cfg, space)
    return {k.key: suggest(trial, k) if k.key in inside else value_at(cfg, k.key) for k in space}
