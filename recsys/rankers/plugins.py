"""Plug-in rankers: modules named by ``eval.plugins``, imported before a run's rankers are resolved.

    # my_rankers.py, importable where the run starts (installed, or in the working directory)
    from recsys.rankers.registry import register_ranker
    register_ranker("recent_popularity", lambda context, settings: RecentPopularity())

    $ python -m recsys.train +experiment=tiny eval.plugins=[my_rankers] eval.rankers=[two_tower,recent_popularity]

Importing the module registers its rankers. ``recsys.train`` imports the modules before it checks the ranker names,
and ``recsys.evaluate`` imports those of the run's saved config, so the report ranks what the run ranked.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from data_pipelines.errors import ConfigError, one_line


def load_plugins(modules: Sequence[str]) -> None:
    """Import each of ``modules`` (eval.plugins); one that cannot be imported is a refusal naming it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # an import runs the module's code: any error of it is the plug-in's
            raise ConfigError(
                f"eval.plugins: cannot import {name!r} ({type(e).__name__}: {one_line(e)}); a plug-in is a module "
                "importable where the run starts (installed, or a .py file in the working directory) that calls "
                "recsys.rankers.registry.register_ranker"
            ) from None
