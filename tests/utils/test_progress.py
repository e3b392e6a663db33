"""recsys/utils/progress.py: a long task's lines come at most (and while it advances, at least) every 30 s, with an ETA from
its rate, or from its estimate before it has one; nested tasks print the innermost only; the ranking primitives
advance the task open around them."""

from __future__ import annotations

import logging

import numpy as np
import torch

from recsys.ranking.interactions import UserItemCSR
from recsys.ranking.retrieval import exact_topk
from recsys.utils import progress
from recsys.utils.progress import Progress, format_seconds, track


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "recsys.utils.progress"]


def test_a_line_every_30_seconds_with_an_eta_from_the_rate(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO), track("ranking valid", 40, unit="points", clock=clock, heartbeat=False) as task:
        for _ in range(12):  # a point every 8 s: a line at 32, 64 and 96 s, not one per point
            clock.now += 8
            task.advance()
    got = lines(caplog)
    assert got[:3] == [
        "ranking valid, 4/40 points (10%), 32 s, ETA 4.8 min",
        "ranking valid, 8/40 points (20%), 64 s, ETA 4.3 min",
        "ranking valid, 12/40 points (30%), 1.6 min, ETA 3.7 min",
    ]
    assert got[3] == "ranking valid: done in 1.6 min"  # the last line: its time (the task took over 30 s)


def test_before_any_progress_the_eta_is_the_estimate(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO), track("ease: fit", estimate=80.0, clock=clock, heartbeat=False) as task:
        clock.now += 10
        task.tick()  # under 30 s: nothing
        clock.now += 25
        task.tick()
        clock.now += 70
        task.tick()
    assert lines(caplog) == [
        "ease: fit, 35 s, ETA 45 s (estimated 80 s)",
        "ease: fit, 1.8 min, over the estimate of 80 s",
        "ease: fit: done in 1.8 min (estimated 80 s)",
    ]


def test_nested_tasks_print_the_innermost_and_short_ones_say_nothing(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO):
        with track("graph_filter: fit on train", clock=clock, heartbeat=False) as outer:
            with track("eigensolver", 5, unit="steps", clock=clock, heartbeat=False, done_line=False) as inner:
                clock.now += 40
                outer.tick()  # waits while the eigensolver is open
                inner.advance()
            clock.now += 1
        with track("popularity: ranking test", 10, clock=clock, heartbeat=False) as quick:
            quick.advance(10)
    assert lines(caplog) == [
        "eigensolver, 1/5 steps (20%), 40 s, ETA 2.7 min",
        "graph_filter: fit on train: done in 41 s",
    ]
    progress.advance(3)  # no task open: nothing happens


def test_the_heartbeat_prints_while_nothing_advances(caplog):
    ticks = []
    task = Progress("probe", every=0.0, clock=lambda: len(ticks), logger=logging.getLogger("recsys.utils.progress"))
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            ticks.append(1)
            task.tick()
    assert len(lines(caplog)) == 3 and lines(caplog)[-1] == "probe, 3 s"
    assert [format_seconds(s) for s in (0.2, 42, 210, 7200)] == ["0 s", "42 s", "3.5 min", "2.0 h"]


def test_the_ranking_primitives_advance_the_open_task():
    rng = np.random.default_rng(0)
    queries, items = torch.randn(37, 4), torch.randn(50, 4)
    seen = UserItemCSR.from_pairs(rng.integers(0, 37, 60), rng.integers(0, 50, 60), num_users=37, num_items=50)
    with track("two_tower: ranking valid", 37, heartbeat=False) as task:
        exact_topk(queries, items, 5, exclude=seen, chunk_size=8)
    assert task.done == 37
