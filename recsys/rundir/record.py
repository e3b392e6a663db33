"""A run dir's record, ``.hydra/`` (config.yaml, overrides.yaml, hydra.yaml): written by the run that is run there.

Hydra would write it before the run starts (conf/config.yaml turns that off: ``hydra.output_subdir: null``), so a
run refused in a run dir (another's weights, other evaluation settings on a finished run) or one already complete
would replace the record of the run whose weights are there. ``recsys.train`` passes the texts to ``fit``, which
writes them when it trains or evaluates; a new run dir gets them at once (a sweep lists a job refused there too).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from recsys.utils.atomic import write_text_atomic

RECORD_DIR = ".hydra"


def has_record(run_dir: Path) -> bool:
    return (Path(run_dir) / RECORD_DIR).exists()


def write_run_record(run_dir: Path, record: Mapping[str, str]) -> None:
    """``.hydra/<name>`` for each (file name, YAML text) of ``record``, each replaced whole (rank 0 only)."""
    for name, text in record.items():
        write_text_atomic(Path(run_dir) / RECORD_DIR / name, text)
