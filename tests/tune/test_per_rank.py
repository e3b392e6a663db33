"""tune.parallel_trials (recsys/tune/per_rank.py): under torchrun each rank trains a trial of its own at once, in a
child process that is a job of one rank; rounds prune against the earlier rounds; a trial whose process dies is a
failed trial, not a dead search."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path

import pytest
import torch

from recsys.distributed.env import DistEnv
from recsys.tune.per_rank import (
    child_environment,
    search_per_rank,
    train_with_history,
    trial_in_process,
)
from recsys.tune.search import chosen_config, search
from tests.helpers.config import tiny_config
from tests.helpers.launch import ROOT, clean_env
from tests.tune.test_search import search_under_torchrun


class _TwoRanksInOneProcess:
    """A stand-in for the coordination of a 2-rank job, seen from rank 0: rank 1's trial of each round is trained
    here too, when rank 0's is gathered (as the real rank 1 would, in parallel)."""

    def __init__(self, run_other) -> None:
        self.env = DistEnv(0, 2, 0, 2, torch.device("cpu"), "gloo")
        self.run_other, self.plan, self.rounds = run_other, None, []

    def from_rank0(self, value):
        self.plan = value
        return value

    def gather(self, mine):
        numbers = [self.plan.first + r for r in range(len(self.plan.values))]
        self.rounds.append(numbers)
        if len(numbers) < 2:
            return [mine, None]
        other = self.run_other(self.plan.first + 1, self.plan.values[1], history=self.plan.history)
        return [mine, other]


def _curves(curves: dict[int, list[float]]):
    """A stand-in trial that validates an epoch at a time with trial n's figures, stopping where ``on_epoch`` says."""

    def train(cfg, trial_dir, deadline, on_epoch=None):
        scores = []
        for epoch, score in enumerate(curves[int(Path(trial_dir).name.split("_")[1])]):
            scores.append(score)
            if on_epoch is not None and on_epoch(epoch, score):
                break
        return {"train": {"best_valid": max(scores), "best_epoch": scores.index(max(scores))}}

    return train


def test_rounds_of_one_trial_a_rank_prune_against_the_earlier_rounds_only(tmp_path):
    """Round 1 trains trials 0 and 1 at once: trial 1 is behind trial 0 at every epoch but has nothing to be pruned
    against (tune.prune_after_trials=1 counts ended trials, and trial 0 has not ended when trial 1 starts). Round 2's
    trials 2 and 3 are pruned against round 1's median at their 2nd epoch, trial 2 being behind it and trial 3 not.
    The study learned each epoch's figure from the ranks' reports: trial 4 (round 3) is pruned at 0.32 by the median
    of round 1's and trial 3's 2nd epochs (0.35), not by round 1's alone (0.30)."""
    curves = {
        0: [0.30, 0.40, 0.45],
        1: [0.10, 0.20, 0.25],
        2: [0.29, 0.25, 0.99],
        3: [0.31, 0.35, 0.50],
        4: [0.10, 0.32, 0.90],
    }
    cfg = tiny_config(["tune.budget_minutes=100", "tune.max_trials=5", "trainer.epochs=3", "tune.prune_after_trials=1"])
    train = _curves(curves)
    run = partial(train_with_history, train_trial=train, deadline=float("inf"))
    comm = _TwoRanksInOneProcess(lambda n, values, history: _as_rank(1, run(cfg, tmp_path, n, values, history=history)))
    trials = search_per_rank(cfg, tmp_path, train, comm, run_mine=lambda cfg, run_dir, n, values, tt, **kw: run(
        cfg, run_dir, n, values, history=kw["history"]))  # fmt: skip
    assert comm.rounds == [[0, 1], [2, 3], [4]]
    assert [t.state for t in trials] == ["complete", "complete", "pruned at epoch 1", "complete", "pruned at epoch 1"]
    assert [t.rank for t in trials] == [0, 1, 0, 1, 0]
    assert [t.valid for t in trials] == [0.45, 0.25, 0.29, 0.50, 0.32]
    assert chosen_config(cfg, trials)[1].number == 3
    # one rank's rounds are the one-at-a-time search's trials, pruned alike
    one_at_a_time = search(cfg, tmp_path, _curves(dict(curves)), clock=iter(range(10**6)).__next__)
    assert [t.state for t in one_at_a_time][:3] == ["complete", "pruned at epoch 1", "pruned at epoch 1"]


def _as_rank(rank, outcome):
    trial, counts, reports = outcome
    trial.rank = rank
    return trial, counts, reports


def test_a_round_is_not_started_past_the_budget(tmp_path):
    """Trials of 4 minutes in a 10-minute budget: round 1 (trials 0, 1) ends at 4 min, round 2 at 8 min; a third
    round (up to 12 min) is not started: four trials in two rounds."""
    clock = [0.0]
    cfg = tiny_config(["tune.budget_minutes=10"])

    def run(cfg, run_dir, n, values, train_trial=None, **kw):
        if n % 2 == 0:
            clock[0] += 240.0  # a round takes its trials' time once: they train at once
        return train_with_history(cfg, run_dir, n, values, lambda *a, **k: {"train": {"best_valid": 0.1 * n,
                                  "best_epoch": 0}}, deadline=float("inf"), history=kw["history"])  # fmt: skip

    def timed(outcome):
        trial, counts, reports = outcome
        trial.seconds = 240.0
        return trial, counts, reports

    comm = _TwoRanksInOneProcess(lambda n, values, history: _as_rank(1, timed(run(cfg, tmp_path, n, values,
                                                                                 history=history))))  # fmt: skip
    trials = search_per_rank(cfg, tmp_path, None, comm, run_mine=lambda *a, **kw: timed(run(*a, **kw)),
                             clock=lambda: clock[0])  # fmt: skip
    assert comm.rounds == [[0, 1], [2, 3]] and len(trials) == 4 and clock[0] == 480.0


def _exits(cfg, trial_dir, deadline, on_epoch=None):
    os._exit(3)  # a crash without an answer: what the out-of-memory killer leaves


def _answers_with_its_environment(cfg, trial_dir, deadline, on_epoch=None):
    seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
    Path(trial_dir).mkdir(parents=True, exist_ok=True)
    (Path(trial_dir) / "environment.json").write_text(json.dumps(seen))
    on_epoch(0, 0.25)
    return {"train": {"best_valid": 0.25, "best_epoch": 0}, "dataset": {"counts": {"train": 7, "valid": 3}}}


def test_a_trials_process_is_a_job_of_one_rank_and_its_crash_a_failed_trial(tmp_path, monkeypatch):
    """The child sees no torchrun job (it makes its own group of one), answers the trial, its counts and the epochs'
    figures it reported; a child that dies without answering is a failed trial naming its exit code."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")  # as under torchrun: the child must not use it
    cfg = tiny_config(["tune.budget_minutes=10"])
    environment = child_environment(DistEnv(1, 2, 1, 2, torch.device("cpu"), "gloo"))
    assert "CUDA_VISIBLE_DEVICES" not in environment and environment["RANK"] is None
    trial, counts, reports = trial_in_process(
        cfg, tmp_path, 4, {"model.loss.temperature": 0.1}, _answers_with_its_environment, deadline=float("inf"),
        history=[], environment=environment,
    )  # fmt: skip
    assert (trial.number, trial.valid, trial.state, counts, reports) == (4, 0.25, "complete", {"train": 7, "valid": 3},
                                                                         {0: 0.25})  # fmt: skip
    seen = json.loads((tmp_path / "tune" / "trial_4" / "environment.json").read_text())
    assert seen == {"RANK": None, "WORLD_SIZE": None, "MASTER_PORT": None, "TORCHELASTIC_USE_AGENT_STORE": None}
    assert (tmp_path / "tune" / "trial_4" / "train.log").read_text().count("[trial 4]") >= 2  # its own log
    trial, counts, reports = trial_in_process(
        cfg, tmp_path, 5, {}, _exits, deadline=float("inf"), history=[], environment=environment
    )
    assert trial.valid is None and counts is None and reports == {}
    assert trial.state == "failed: the trial's process exited with code 3 before it answered"
    # a hang: no answer 2 s past the deadline (a trial past the budget stops after its epoch) is killed, not waited on
    trial, counts, reports = trial_in_process(
        cfg, tmp_path, 6, {}, _sleeps, deadline=time.monotonic(), history=[], environment=environment, grace_s=2.0
    )
    assert (trial.valid, counts, reports) == (None, None, {})
    assert trial.state == "failed: no answer 2 s past the budget; its process was killed"  # and joined: it is gone


def _sleeps(cfg, trial_dir, deadline, on_epoch=None):
    Path(trial_dir).mkdir(parents=True, exist_ok=True)
    (Path(trial_dir) / "pid").write_text(str(os.getpid()))
    time.sleep(300)


_RANK = """
import sys
from pathlib import Path
from recsys.tune.per_rank import trial_in_process
from tests.helpers.config import tiny_config
from tests.tune.test_per_rank import _sleeps
trial_in_process(tiny_config([]), Path(sys.argv[1]), 0, {}, _sleeps, deadline=float("inf"), history=[], environment={})
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie nobody reaped has ended


def test_a_trials_process_ends_when_its_rank_is_killed(tmp_path):
    """A rank killed mid-trial (torchrun stopping the job, the scheduler's SIGKILL) takes its trial's process with it
    within seconds, instead of an orphan training on for hours."""
    rank = subprocess.Popen([sys.executable, "-c", _RANK, str(tmp_path)], env=clean_env(), cwd=ROOT)
    pid_file = tmp_path / "tune" / "trial_0" / "pid"
    for _ in range(600):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _running(child)
    rank.send_signal(signal.SIGKILL)
    rank.wait()
    for _ in range(100):
        if not _running(child):
            break
        time.sleep(0.1)
    outlived = _running(child)
    if outlived:
        os.kill(child, signal.SIGKILL)
    assert not outlived, "the trial's process outlived its rank"


def test_a_rank_on_a_gpu_gives_its_trial_that_gpu_alone(monkeypatch):
    cuda = DistEnv(2, 4, 2, 4, torch.device("cuda", 2), "nccl")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert child_environment(cuda)["CUDA_VISIBLE_DEVICES"] == "2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the job's GPUs: rank 2's is the physical 6
    assert child_environment(cuda)["CUDA_VISIBLE_DEVICES"] == "6"


def _log_span(log: Path) -> tuple[datetime, datetime]:
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", log.read_text(), flags=re.M)
    assert stamps, log
    return tuple(datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in (stamps[0], stamps[-1]))


def test_under_torchrun_each_rank_trains_its_own_trial_at_once(tmp_path, data_root):
    """Two ranks (gloo), three trials: trials 0 and 1 train at the same time, on ranks 0 and 1, each a job of one
    rank; trial 2 on rank 0 in the next round; the chosen settings train as the run on both ranks."""
    # 4 epochs a trial (the helper's 2 took ~2 s): long enough that the two trials' spans overlap whatever the ranks'
    # start-up skew on 2 loaded cores (once 28 ms apart with 2)
    run_dir = search_under_torchrun(tmp_path, data_root, "tune.parallel_trials=true", "trainer.epochs=4")
    table = json.loads((run_dir / "tune" / "trials.json").read_text())
    results = json.loads((run_dir / "results.json").read_text())
    assert [(t["number"], t["rank"], t["state"]) for t in table["trials"]] == [
        (0, 0, "complete"), (1, 1, "complete"), (2, 0, "complete")
    ]  # fmt: skip
    assert "| trial | rank |" in (run_dir / "tune" / "trials.md").read_text()
    logs = {n: run_dir / "tune" / f"trial_{n}" / "train.log" for n in range(3)}
    for log in logs.values():  # a job of one rank: the plan puts every table on its rank 0
        (weights,) = re.findall(r"table weights per rank \(.*\): (.*)", log.read_text())
        assert re.fullmatch(r"rank 0 [\d.]+ MB", weights), (log, weights)
    (start0, end0), (start1, end1) = _log_span(logs[0]), _log_span(logs[1])
    assert start1 < end0 and start0 < end1  # at once
    assert _log_span(logs[2])[0] >= max(end0, end1)  # the next round
    assert results["train"]["world_size"] == 2
    best = max(table["trials"], key=lambda t: t["valid"])
    assert table["chosen"] == best["number"]
    # the ranks' trials kept their users' figures: the lead's standard error is the paired one
    assert f"paired over {int(results['valid']['two_tower']['num_users_evaluated'])} users" in table["why"]
    # a trial's figure is that of what its run serves (tiny's default: the best on valid of the two-tower and its
    # fusions), as its own evaluation stage logged it
    served_line = re.search(
        r"served: (\S+), the best on valid recall@20 \(([\d.]+)\)", logs[best["number"]].read_text()
    )
    assert served_line.group(1) == best["served"] and float(served_line.group(2)) == pytest.approx(
        best["valid"], abs=1e-4
    )
    # the run trains the chosen settings on two ranks where its trial trained on one: the same global batches, the sums
    # in another order, so another two-tower (0.0064 apart on valid on an AVX-512 machine), whose fusion moved 0.012 on
    # these 400 valid users (the lead's standard error above: 0.014); the two-tower alone ranks 0.06 below the fusion
    assert results["valid"][best["served"]]["recall@20"] == pytest.approx(best["valid"], abs=0.03)
