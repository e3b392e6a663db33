"""The built-in rankers' packages, found rather than listed: every package under recsys/rankers/ with a ``spec.py``
(its registration: ``register_ranker``) or a ``part.py`` (its servable part: ``register_part``). A new built-in ranker
is its package (and its settings' YAML in conf/eval/rankers/): no list elsewhere names it. Standard library only:
the serving bundle's reader finds the part modules through it without torchrec or Hydra.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

PACKAGE = "recsys.rankers"
_ROOT = Path(__file__).resolve().parent


def builtin_modules(name: str) -> list[str]:
    """``recsys.rankers.<package>.<name>`` of every ranker package that has such a module, in the packages' order."""
    return [
        f"{PACKAGE}.{info.name}.{name}"
        for info in sorted(pkgutil.iter_modules([str(_ROOT)]), key=lambda info: info.name)
        if info.ispkg and (_ROOT / info.name / f"{name}.py").is_file()
    ]


def import_builtin(name: str) -> None:
    """Import every built-in package's ``name`` module (each registers itself on import)."""
    for module in builtin_modules(name):
        importlib.import_module(module)
