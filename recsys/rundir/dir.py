"""What an earlier run left in a run dir: set aside when starting over, reported when already complete.

A training run writes into ``runs/<run_name>/``::

    checkpoints/   metrics.jsonl   tb/   results.json   (+ train.log and .hydra/, rewritten by every start)

and what is made from its weights afterwards: ``served/`` (its evaluation stage), ``refit/`` (trainer.refit),
``export/`` (recsys.export), ``eval/`` and ``eval_sample_*/`` (recsys.evaluate).

``trainer.resume=none`` moves all of them into ``checkpoints.replaced.<n>/`` together (never
deleted), so the new run's metrics and TensorBoard curves do not mix with the old ones and no bundle or
report of the old weights stays beside the new ones; a run that trains further from its checkpoints
(more epochs) moves the outputs made from its earlier weights to ``outputs.replaced.<n>/``; a run that
finds logs but no checkpoint to resume (an attempt that crashed before its first) moves the logs and
outputs to ``logs.replaced.<n>/``.
``trainer.resume=auto`` on a run whose newest checkpoint is past its last epoch (or early-stopped)
does not train again: it says so and returns the results it wrote then; asked for other evaluation
settings (``eval.*``), which its results, served ranker and bundle were not made with, it is refused
naming them (``check_finished_evaluation``).
"""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from recsys.config import EvalConfig, TrainerConfig
from recsys.rundir.checkpoint import CONFIG_FILE, TrainerState, latest_checkpoint, read_trainer_state
from recsys.rundir.outputs import drop_records_after
from recsys.rundir.saved_config import read_config_file
from recsys.utils.refusals import ANOTHER_RUN_DIR, RunRefused

log = logging.getLogger(__name__)

LOGS = ("metrics.jsonl", "tb", "results.json")  # a run's outputs besides checkpoints/ that belong to its weights
# made from the weights after training: the stage's served ranker, the refit, recsys.export's bundle and
# recsys.evaluate's reports (eval_sample_<n>_seed_<s>/: derived_outputs)
DERIVED = ("served", "refit", "export", "eval")
RESULTS_FILE = "results.json"


def derived_outputs(run_dir: Path) -> list[Path]:
    """What ``run_dir`` holds that was made from its weights (``DERIVED`` and the sampled reports)."""
    found = [run_dir / name for name in DERIVED if (run_dir / name).exists()]
    return found + sorted(run_dir.glob("eval_sample_*"))


def _next_free(run_dir: Path, stem: str) -> Path:
    n = 1
    while (run_dir / f"{stem}.{n}").exists():
        n += 1
    return run_dir / f"{stem}.{n}"


def set_aside_earlier_run(run_dir: Path) -> Path | None:
    """Move an earlier run's checkpoints, logs and outputs to ``checkpoints.replaced.<n>/``; returns it (None:
    nothing there).

    Rank 0 only. The logs, bundle and reports land beside the step checkpoints they belong to.
    """
    ckpt_root = run_dir / "checkpoints"
    moved = [run_dir / name for name in LOGS if (run_dir / name).exists()] + derived_outputs(run_dir)
    if not ckpt_root.exists() and not moved:
        return None
    replaced = _next_free(run_dir, "checkpoints.replaced")
    if ckpt_root.exists():
        ckpt_root.rename(replaced)
    else:
        replaced.mkdir()
    for path in moved:
        path.rename(replaced / path.name)
    log.warning(
        "trainer.resume=none: the earlier run's checkpoints and %s moved to %s",
        ", ".join(p.name for p in moved) or "no logs",
        replaced,
    )
    return replaced


def set_aside_outputs(run_dir: Path, resumed_from: Path) -> Path | None:
    """A run that trains further from ``resumed_from``: the bundle and reports of its earlier weights (and the refit
    and served ranker they came from) move to ``outputs.replaced.<n>/`` (rank 0); None: there were none."""
    outputs = derived_outputs(run_dir)
    if not outputs:
        return None
    replaced = _next_free(run_dir, "outputs.replaced")
    replaced.mkdir()
    for path in outputs:
        path.rename(replaced / path.name)
    log.warning(
        "training on from %s: %s of the earlier weights moved to %s",
        resumed_from.name,
        ", ".join(p.name for p in outputs),
        replaced,
    )
    return replaced


def tidy_earlier_logs(run_dir: Path, resumed_step: int | None) -> None:
    """Rank 0, before logging: what an earlier, crashed attempt left in metrics.jsonl / tb/ must not mix
    with this run's records. Resuming from step N: its records after N go (logged again). With no
    checkpoint to resume (it crashed before the first): its metrics.jsonl, tb/, results.json and any
    outputs made from weights no longer there move to ``logs.replaced.<n>/`` (never deleted), so step 1
    is logged once."""
    if resumed_step is not None:
        drop_records_after(run_dir / "metrics.jsonl", resumed_step)
        return
    logs = [run_dir / name for name in LOGS if (run_dir / name).exists()] + derived_outputs(run_dir)
    if not logs:
        return
    replaced = _next_free(run_dir, "logs.replaced")
    replaced.mkdir()
    for path in logs:
        path.rename(replaced / path.name)
    log.warning(
        "no checkpoint to resume from: the earlier attempt's %s moved to %s (training starts at step 0)",
        ", ".join(p.name for p in logs),
        replaced,
    )


def is_finished(state: TrainerState, epochs: int) -> bool:
    """The saved run trained every epoch ``epochs`` asks for, or stopped early (more epochs would not resume it)."""
    return state.next_batch == 0 and (state.early_stopped or state.epoch >= epochs)


def completed_results(run_dir: Path, checkpoint: Path | None, fingerprint: str, epochs: int) -> dict[str, Any] | None:
    """The results of the finished run in ``run_dir`` whose newest checkpoint is ``checkpoint``.

    None: no checkpoint, weights of another data/model config (resuming refuses them, naming both),
    not finished, its results were never written, or the checkpoint they were tested with is gone
    (the final test evaluation then runs again).
    """
    results = run_dir / RESULTS_FILE
    if checkpoint is None or not results.is_file():
        return None
    state = read_trainer_state(checkpoint)
    if state.fingerprint != fingerprint or not is_finished(state, epochs):
        return None
    saved = json.loads(results.read_text())
    tested = saved.get("checkpoint")
    if (
        tested and not Path(tested).is_dir()
    ):  # the weights it describes are gone: test again (the trainer rebuilds or names them)
        return None
    written = datetime.datetime.fromtimestamp(results.stat().st_mtime).strftime("%Y-%m-%d %H:%M:%S")
    if state.early_stopped:
        how, options = f"early-stopped after epoch {state.epoch - 1}", "trainer.resume=none starts over"
    else:
        how, options = (
            f"{state.epoch} epochs",
            "a larger trainer.epochs trains further, trainer.resume=none starts over",
        )
    log.info(
        "run already complete (results from %s; %s, %d steps): nothing trained, %s printed again; %s",
        written,
        how,
        state.step,
        results,
        options,
    )
    for split in ("valid", "test"):  # the file's keys are sorted: the model first again, as the trainer prints it
        saved[split] = dict(sorted(saved[split].items(), key=lambda item: item[0] != "two_tower"))
    return saved


# eval.* keys that change no figure: how the stage batches its work, and where plug-in rankers come from (which
# rankers rank is eval.rankers)
EVAL_WORK_KEYS = ("batch_size", "chunk_size", "plugins")


def _flat(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _shown(value: Any) -> str:
    return repr(value) if value == "" else "null" if value is None else str(value)


def check_finished_evaluation(run_dir: Path, tcfg: TrainerConfig, ecfg: EvalConfig, fingerprint: str) -> None:
    """trainer.resume=auto on a finished run (``completed_results``' test, from its files alone, against the run's
    ``fingerprint``): refuse ``eval.*`` settings (``ecfg``) other than those its evaluation stage used, naming each,
    before any work. The run is not trained or ranked again, so its results.json, served/ and bundle would say
    nothing of them."""
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    if tcfg.resume != "auto" or checkpoint is None or not (run_dir / RESULTS_FILE).is_file():
        return
    state = read_trainer_state(checkpoint)
    if state.fingerprint != fingerprint or not is_finished(state, tcfg.epochs):
        return
    if not (checkpoint / CONFIG_FILE).is_file():  # saved before checkpoints held their config: nothing to compare
        return
    saved = _flat(asdict(read_config_file(checkpoint / CONFIG_FILE).eval), "eval.")
    now = _flat(asdict(ecfg), "eval.")
    changed = [
        f"{key}={_shown(now[key])} (the run's: {_shown(saved.get(key))})"
        for key in now
        if key.split(".")[1] not in EVAL_WORK_KEYS and now[key] != saved.get(key)
    ]
    if changed:
        raise RunRefused(
            f"{run_dir}: this run is complete and its evaluation used other settings: {'; '.join(changed)}. "
            "Its results, served ranker and bundle are those settings'; nothing is trained or ranked again here. "
            f"Keep the run's settings, or train with these in {ANOTHER_RUN_DIR}, or here with trainer.resume=none "
            "(this run is set aside, not deleted)"
        )


def result_ks(results: dict[str, Any]) -> list:
    """The cut-offs a results.json holds (eval.ks of the run that wrote it)."""
    return sorted(int(key.split("@")[1]) for key in results["test"]["two_tower"] if key.startswith("recall@"))
