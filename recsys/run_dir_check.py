"""Hydra callback: ``recsys.evaluate`` / ``recsys.export`` refuse a ``run_dir`` that does not exist before
Hydra creates its output dir (``<run_dir>/eval``, ``<run_dir>``) in it: a typo must not leave an empty run behind.

Configured in conf/evaluate.yaml and conf/export.yaml (``hydra.callbacks``); Hydra calls ``on_run_start``
before it makes the job's output dir.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class RunDirMustExist(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = config.get("run_dir")
        if isinstance(run_dir, str) and run_dir and run_dir != "???" and not Path(run_dir).is_dir():
            # Hydra turns a callback's exception into a warning and goes on: exit instead
            print(
                f"error: run_dir={run_dir}: no such run dir (nothing was created there); give the folder "
                "`python -m recsys.train` wrote, e.g. runs/<run_name>",
                file=sys.stderr,
            )
            sys.exit(1)
