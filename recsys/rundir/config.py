"""The config a run dir's weights were trained with, as ``recsys.evaluate`` and ``recsys.export`` rebuild the
model from it: the checkpoint's own ``config.yaml``, checked against the weights' fingerprint."""

from __future__ import annotations

from pathlib import Path

from recsys.config import Config
from recsys.config.fingerprint import config_fingerprint
from recsys.rundir.checkpoint import CONFIG_FILE, STATE_FILE, read_trainer_state
from recsys.rundir.saved_config import read_config_file
from recsys.utils.refusals import MissingPath, RunRefused


def checkpoint_dir(run_dir: Path, checkpoint: str) -> Path:
    return Path(checkpoint) if checkpoint else run_dir / "checkpoints" / "best"


def load_run_config(run_dir: Path, checkpoint: str = "") -> Config:
    """The config the checkpoint's weights were trained with: its own copy (``config.yaml``) when it has
    one, else the run's ``.hydra/config.yaml`` (which a later, refused ``recsys.train`` in the same run
    dir rewrites at start-up)."""
    ckpt = checkpoint_dir(run_dir, checkpoint)
    path = ckpt / CONFIG_FILE
    if not path.is_file():
        path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise MissingPath(f"{path}: missing; is {run_dir} a run dir written by `python -m recsys.train`?")
    cfg = read_config_file(path)
    # the weights' own record of their data / model config: a config that differs would build another
    # model or split (and report numbers for a protocol the weights never saw)
    if (ckpt / STATE_FILE).is_file():
        saved, now = read_trainer_state(ckpt).fingerprint, config_fingerprint(cfg)
        if saved and saved != now:
            raise RunRefused(
                f"{path}: another data/model config (fingerprint {now}) than the weights in {ckpt} were "
                f"trained with ({saved}, its {STATE_FILE}); was it edited, or rewritten by a later "
                "recsys.train in this run dir? Restore the run's config, or evaluate the run it belongs to"
            )
    return cfg
