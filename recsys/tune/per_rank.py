"""``tune.parallel_trials=true``: under torchrun, each rank trains a trial of its own at once.

    $ torchrun --nproc-per-node 8 -m recsys.train +experiment=gowalla tune.budget_minutes=20 tune.parallel_trials=true

The search proceeds in rounds of up to world-size trials. In each round rank 0 asks the study for one proposal per
rank (TPE with the constant liar, so that proposals asked for together are spread apart) and broadcasts them; every
rank trains its own in a child process that is a job of one rank (its own process group of one, this rank's device
alone: the trial's tables must fit one device), and the ranks gather the outcomes for rank 0 to tell the study. A
trial is pruned against the trials of the earlier rounds (the child rebuilds the study's pruner from them), never
against those of its own round. A round is not started when the longest trial so far would not end within the budget,
the rule of the one-at-a-time search (recsys/tune/search.py), whose choice, table and final run follow unchanged: the
chosen settings are trained as the run, on all the ranks.

A child process costs its start (a few seconds: importing torch and torchrec) and the dataset's loading, which the
in-process trials of the other mode do as well; the prepared dataset is made once, before the first round. The
coordination runs over a gloo group of its own with a timeout past the budget, since a rank whose trial ended first
waits there for the others' (the run's NCCL group would time out after COLLECTIVE_TIMEOUT).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from recsys.config import Config
from recsys.distributed.env import COLLECTIVE_TIMEOUT, DistEnv
from recsys.tune.search import (
    TrainTrial,
    keep_compared_figures,
    new_pruner,
    new_study,
    one_process,
    refit_reserve,
    run_trial,
    tell,
)
from recsys.tune.space import trial_values
from recsys.tune.trials_table import TUNE_DIR, Trial

log = logging.getLogger(__name__)

# what the launcher tells a rank about its job: a trial's child process is a job of one rank and must not see them
_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")  # fmt: skip


@dataclass(frozen=True)
class Round:
    """Rank 0's decision for a round: the trials' first number and each rank's settings (fewer than the ranks: the
    last round of tune.max_trials), the earlier rounds' trials as the pruner sees them; no settings: the search ends."""

    first: int
    values: list[dict[str, Any]]
    history: list  # optuna FrozenTrials


class Coordination:
    """Rank 0's values to every rank and every rank's to every rank, over a gloo group of its own (module docstring)."""

    def __init__(self, env: DistEnv, budget_s: float) -> None:
        self.env = env
        # a rank whose trial ended waits here for the others': up to the budget, then a trial past it has as long
        # again to answer before it is killed (trial_in_process's grace_s); the timeout outlasts both
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=2 * budget_s) + 4 * COLLECTIVE_TIMEOUT)

    def from_rank0(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        out = [None] * self.env.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def close(self) -> None:
        dist.destroy_process_group(self.group)


def search_per_rank(
    cfg: Config,
    run_dir: Path,
    train_trial: TrainTrial,
    comm: Coordination,
    run_mine: Callable[..., tuple[Trial, dict | None, dict[int, float]]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[Trial]:
    """The trials of ``cfg.tune``, trained world-size at a time (module docstring), in order, on every rank.
    ``run_mine``: how this rank trains its trial (default: in a child process of one rank, ``trial_in_process``)."""
    run_mine = run_mine or trial_in_process
    tune, rank, world = cfg.tune, comm.env.rank, comm.env.world_size
    budget_s = 60.0 * float(tune.budget_minutes)
    study = new_study(cfg, parallel=True) if rank == 0 else None
    environment = child_environment(comm.env)
    start, trials, reserve = clock(), [], None
    while not tune.max_trials or len(trials) < tune.max_trials:
        elapsed, longest = clock() - start, max((t.seconds for t in trials), default=0.0)
        plan, asked = Round(len(trials), [], []), []
        if rank == 0 and not (elapsed + longest > budget_s or elapsed >= budget_s):
            plan, asked = _plan_round(cfg, study, len(trials), world)
        plan = comm.from_rank0(plan)
        if not plan.values:
            log.info("tune: %.0f s of %.0f s spent; no round of trials (up to %.0f s) is started", elapsed, budget_s,
                     longest)  # fmt: skip
            break
        mine = None
        if rank < len(plan.values):
            trial, counts, reports = run_mine(cfg, run_dir, plan.first + rank, plan.values[rank], train_trial,
                                              deadline=start + budget_s, history=plan.history, environment=environment,
                                              grace_s=budget_s)  # fmt: skip
            mine = (replace(trial, rank=rank), counts, reports)
        outcomes = [o for o in comm.gather(mine) if o is not None]
        for proposal, (trial, _, reports) in zip(asked, outcomes, strict=False):  # rank 0: the study learns them
            for epoch, score in sorted(reports.items()):
                proposal.report(score, epoch)
            tell(study, proposal, trial)
        for trial, counts, _ in outcomes:
            trials.append(trial)
            keep_compared_figures(trials)
            if reserve is None:  # trial 0 is the configured training: what the run's refit, if any, will about cost
                reserve = refit_reserve(cfg, trial, counts)
                budget_s -= reserve
    return trials


def _plan_round(cfg: Config, study, first: int, world: int) -> tuple[Round, list]:
    """Rank 0: the next round's settings, one per rank (fewer where tune.max_trials ends sooner), and the study's
    trials asked for them."""
    from optuna.trial import TrialState  # noqa: PLC0415

    history = study.get_trials(deepcopy=True, states=(TrialState.COMPLETE, TrialState.PRUNED))
    count = world if not cfg.tune.max_trials else min(world, cfg.tune.max_trials - first)
    asked = [study.ask() for _ in range(count)]
    values = [trial_values(a, cfg, cfg.tune.space, first + i) for i, a in enumerate(asked)]
    return Round(first, values, history), asked


def trial_in_process(
    cfg: Config, run_dir: Path, number: int, values: dict[str, Any], train_trial: TrainTrial, *, deadline: float,
    history: list, environment: dict[str, str | None], grace_s: float = float("inf"),
) -> tuple[Trial, dict | None, dict[int, float]]:  # fmt: skip
    """This rank's trial trained in a child process that is a job of one rank on this rank's device; a child that
    dies without an answer (a crash, the out-of-memory killer), or has none ``grace_s`` past the deadline (a hang:
    a trial past the budget stops after its epoch), is a failed trial, and the search goes on."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state, no process group inherited
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_trial_process_main,
        args=(send, os.getpid(), environment, cfg, run_dir, number, values, train_trial, deadline, history),
        name=f"recsys-trial-{number}",
    )
    began = time.monotonic()
    child.start()
    send.close()  # the child holds the only writer: its exit without an answer ends recv() with EOFError
    answer, killed = None, False
    try:
        while not receive.poll(PARENT_CHECK_S):
            if time.monotonic() > deadline + grace_s:
                child.kill()
                killed = True
                break
        else:
            answer = receive.recv()
    except EOFError:  # it exited without answering
        pass
    finally:
        receive.close()
    child.join()
    if answer is None:
        why = (
            f"failed: no answer {grace_s:.0f} s past the budget; its process was killed"
            if killed
            else f"failed: the trial's process exited with code {child.exitcode} before it answered"
        )
        log.error("tune: trial %d: %s", number, why)
        return Trial(number, values, None, time.monotonic() - began, why), None, {}
    trial, counts, reports = answer
    # its seconds with the child's start and the dataset's loading: what the next round's budget check weighs
    return replace(trial, seconds=time.monotonic() - began), counts, reports


def child_environment(env: DistEnv) -> dict[str, str | None]:
    """The variables a trial's child sets (None: removes) before anything reads them: no torchrun job, and where
    this rank trains on a GPU that GPU alone (CUDA_VISIBLE_DEVICES: the child's device 0 is this rank's)."""
    changes: dict[str, str | None] = dict.fromkeys(_JOB_VARIABLES)
    if env.device.type == "cuda":
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        index = env.device.index or 0
        changes["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)
    return changes


def _trial_process_main(
    send, parent, environment, cfg, run_dir, number, values, train_trial, deadline, history
) -> None:
    """The child: a job of one rank that trains the trial, its pruner the study's over ``history``; answers on
    ``send`` with (trial, counts, the epochs' reported figures)."""
    _exit_with(parent)
    for key, value in environment.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _child_logging(number, Path(run_dir))
    send.send(train_with_history(cfg, run_dir, number, values, train_trial, deadline=deadline, history=history))
    send.close()


PARENT_CHECK_S = 2.0  # how often a trial's process looks for its parent, and its rank for the trial's answer


def _exit_with(parent: int) -> None:
    """Ends this process once ``parent`` is gone (killed: torchrun stopping the job after another rank failed, or
    the scheduler's SIGKILL), so that no orphaned trial trains on for hours on a device the next job is given."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def train_with_history(
    cfg: Config, run_dir: Path, number: int, values: dict[str, Any], train_trial: TrainTrial, *, deadline: float,
    history: list, **_,
) -> tuple[Trial, dict | None, dict[int, float]]:  # fmt: skip
    """The trial trained here, in this process, its pruner the study's rebuilt over ``history`` (the earlier rounds'
    trials): what a trial's child does; (trial, counts, the epochs' figures reported to the pruner)."""
    import optuna  # noqa: PLC0415

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=new_pruner(cfg.tune))
    study.add_trials(history)
    return run_trial(cfg, run_dir, number, values, train_trial, deadline=deadline, clock=time.monotonic,
                     proposal=study.ask(), sync=one_process)  # fmt: skip


def _child_logging(number: int, run_dir: Path) -> None:
    """The child's records on the console (recsys's own, every rank's trial: each says which) and all of them in
    ``<trial dir>/train.log``: Hydra's handlers belong to the parent."""
    from recsys.utils.logs import ConsoleFilter, ignore_known_warnings  # noqa: PLC0415

    trial_dir = run_dir / TUNE_DIR / f"trial_{number}"
    trial_dir.mkdir(parents=True, exist_ok=True)
    form = logging.Formatter(f"[%(asctime)s][trial {number}][%(name)s][%(levelname)s] - %(message)s")
    console, file = logging.StreamHandler(), logging.FileHandler(trial_dir / "train.log")
    console.addFilter(ConsoleFilter())
    root = logging.getLogger()
    for handler in list(root.handlers):  # a library's basicConfig() while the trial's arguments were unpickled
        root.removeHandler(handler)
    for handler in (console, file):
        handler.setFormatter(form)
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    ignore_known_warnings()
