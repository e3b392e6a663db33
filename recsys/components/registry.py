"""Components chosen by name in the config (torchtitan's shape): a package of modules, each defining a ``Config``
dataclass whose ``name`` field's default is the name it is chosen by, with ``check(need, key)`` (its values' rules)
and ``build()``. Adding one is its module and its YAML (conf/model/<group>/<name>.yaml): nothing registers it.

A config section is a plain dict while Hydra composes it (``{name: softmax, temperature: 0.1}``: the keys of the
chosen component only) and becomes that component's ``Config`` where the schema is built
(``ModelConfig.__post_init__``), so a key no component of that name has is refused naming its full path.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from data_pipelines.errors import ConfigError


@cache
def component_configs(package: str) -> dict[str, type]:
    """``name -> Config`` of every module of ``package`` (its modules starting with ``_`` excepted), sorted."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name.startswith("_"):
            continue
        config = getattr(importlib.import_module(f"{package}.{info.name}"), "Config", None)
        if config is None or not dataclasses.is_dataclass(config):
            continue
        name = {f.name: f.default for f in dataclasses.fields(config)}.get("name")
        if name in found:
            raise TypeError(f"{package}: two components are named {name!r}")
        found[name] = config
    return dict(sorted(found.items()))


def to_component(section: Any, package: str, key: str) -> Any:
    """``section`` (a mapping with ``name``, or a component's Config already) as the Config of the component of
    ``package`` it names; ``key``: its path in the config (``model.loss``), for the refusals."""
    configs = component_configs(package)
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        if type(section) not in configs.values():
            raise ConfigError(f"{key}: {type(section).__name__} is not a component of {package}")
        return section
    if not isinstance(section, Mapping):
        group = key.replace(".", "/")  # the config group that chooses one (conf/model/loss/: model/loss=NAME)
        raise ConfigError(
            f"{key}={section!r}: expected a section with a name ({', '.join(configs)}): choose one with {group}=NAME"
        )
    name = section.get("name")
    if name not in configs:
        raise ConfigError(f"{key}.name={name!r}: expected one of {', '.join(configs)}")
    config = configs[name]
    known = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}: not a setting of {key}.name={name} (its settings: {', '.join(sorted(known - {'name'})) or 'none'})"
        )
    hints = typing.get_type_hints(config)
    values = {}
    for field, value in section.items():
        _check_type(f"{key}.{field}", value, hints[field])
        values[field] = float(value) if hints[field] is float else value  # `temperature=1` means 1.0
    return config(**values)


_SCALARS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _check_type(key: str, value: Any, hint: Any) -> None:
    """A scalar setting of the type its field declares (an int where a float is asked is taken)."""
    allowed = _SCALARS.get(hint)
    if allowed is None:
        return
    if isinstance(value, bool) and hint is not bool:
        allowed = ()
    if not isinstance(value, allowed):
        raise ConfigError(f"{key}={value!r}: expected a {hint.__name__}")
