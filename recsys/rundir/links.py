"""No file a run appends to or writes in place is a symbolic link: through one, a run would write outside its run dir
(or into another run's). ``.lock``, ``metrics.jsonl`` and the Hydra job log (``train.log``; ``export.log``,
``eval/evaluate.log``) are opened for writing where they are; everything else is written beside and renamed into
place, which replaces a link rather than writing through it.
"""

from __future__ import annotations

import os
from pathlib import Path

from recsys.utils.refusals import RunRefused

APPENDED = (".lock", "metrics.jsonl")  # the run's own, besides its Hydra job log


class LinkedFile(RunRefused):
    """A file the run writes in place is a symbolic link (a refusal: one line, recsys/utils/refusals.py)."""


def link_problem(path: Path) -> str | None:
    """Why the run must not write ``path`` in place (it is a symbolic link), None when it may."""
    path = Path(path)
    if not path.is_symlink():
        return None
    return (
        f"{path} is a symbolic link (to {os.readlink(path)}); a run writes its {path.name} in its own run dir, never "
        "through a link (out of the run dir, or into another run's): remove the link"
    )


def refuse_link(path: Path) -> None:
    """Raise ``LinkedFile`` when ``path`` is a symbolic link."""
    problem = link_problem(path)
    if problem:
        raise LinkedFile(problem)
