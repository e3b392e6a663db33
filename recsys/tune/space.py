"""The search space: each knob of ``tune.space`` (recsys/config/tune.py) as an Optuna suggestion."""

from __future__ import annotations

from typing import Any

from recsys.config import KnobConfig


def suggest(trial, knob: KnobConfig) -> Any:
    """A value of ``knob`` drawn by an Optuna ``trial`` (the knob's key names the parameter)."""
    if knob.kind == "choice":
        return trial.suggest_categorical(knob.key, list(knob.choices))
    if knob.kind == "int":
        return trial.suggest_int(knob.key, int(knob.low), int(knob.high))
    return trial.suggest_float(knob.key, float(knob.low), float(knob.high), log=knob.kind == "log")


def describe(knob: KnobConfig) -> str:
    """``model.temperature: log [0.03, 0.3]``: a knob as the run's log and the trials table state it."""
    if knob.kind == "choice":
        return f"{knob.key}: one of {list(knob.choices)}"
    return f"{knob.key}: {knob.kind} [{knob.low:g}, {knob.high:g}]"
