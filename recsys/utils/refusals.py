"""The refusals: what a run cannot go on with for a reason its user can fix from the message alone.

A refusal is a ``DatasetError`` (bad or missing input files), a ``ConfigError`` (a config key or
value that cannot work) or a ``RunRefused`` (the run's own state: a run dir another training
holds, weights of another data / model config, a checkpoint that cannot be resumed, a folder
export cannot write). The entry points print one as one line (recsys/job/entry.py).
"""

from __future__ import annotations

from data_pipelines.errors import ConfigError, DatasetError

__all__ = ["ANOTHER_RUN_DIR", "REFUSALS", "MissingPath", "PathTaken", "RunRefused"]


class RunRefused(ValueError):
    """A run refused for its state (not its input files or config values); the message names the
    path and what to do."""


class MissingPath(RunRefused, FileNotFoundError):
    """A run refused because a file or folder it needs is not there (a checkpoint, a run's config)."""


class PathTaken(RunRefused, FileExistsError):
    """A run refused because the path it would write holds something it must not replace."""


REFUSALS = (DatasetError, ConfigError, RunRefused)

# where a refusal sends a run that cannot use its run dir: a run_name names it unless hydra.run.dir is set by hand
ANOTHER_RUN_DIR = "another run dir (another run_name, or another hydra.run.dir where it is set by hand)"
