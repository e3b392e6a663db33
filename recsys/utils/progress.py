"""Progress lines of a long task, with an ETA, at most one every ``every`` seconds (no per-block spam, no silent minute).

    with track("two_tower+graph_filter: ranking valid", total=4 * 29_858, unit="user-points", estimate=160.0):
        ...                      # the ranking primitives call advance(rows) after each block of users
    # two_tower+graph_filter: ranking valid, 55,000/119,432 user-points (46%), 95 s, ETA 1.9 min

A task's ETA is its measured rate once it has advanced (elapsed x left / done), before that its cost estimate (the
ranker's, recsys/rankers/cost.py) less the time spent. Tasks nest (a fit's eigensolver inside the stage's fit): the
innermost takes ``advance`` and prints; the ones around it wait. A heartbeat thread ticks the innermost task every
``every`` seconds, so a step that reports nothing for minutes (one O(I^3) factorisation) still gets its line; tests
pass ``clock`` and ``heartbeat=False`` and call ``tick``. Imports nothing of recsys: the ranking primitives below
the stage use it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

EVERY_SECONDS = 30.0  # a progress line at most this often, and at least this often while a task runs

_ACTIVE: list[Progress] = []  # the open tasks, innermost last (the evaluation stage runs on one thread)


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """One task's progress: ``advance`` counts its units, ``tick`` prints a line once ``every`` seconds have passed
    since the last one (or since the start)."""

    def __init__(
        self,
        label: str,
        total: float | None = None,
        *,
        unit: str = "",
        estimate: float | None = None,
        every: float = EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        """``total``: units of work (None: unknown, the ETA from ``estimate`` alone); ``estimate``: the cost model's
        seconds for the whole task (None: none)."""
        self.label, self.total, self.unit, self.estimate = label, total, unit, estimate
        self.every, self.clock, self.logger = every, clock, logger
        self.done = 0.0
        self.start = self.last = clock()
        self.lines = 0
        self._lock = threading.Lock()

    def advance(self, n: float = 1) -> None:
        with self._lock:
            self.done += n
        self.tick()

    def eta(self, now: float) -> str:
        """The time left: from the rate so far, else from the estimate; "" when neither says."""
        elapsed = now - self.start
        if self.total and self.done > 0:
            return f"ETA {format_seconds(elapsed * max(self.total - self.done, 0) / self.done)}"
        if self.estimate is not None:
            left = self.estimate - elapsed
            if left >= 0:
                return f"ETA {format_seconds(left)} (estimated {format_seconds(self.estimate)})"
            return f"over the estimate of {format_seconds(self.estimate)}"
        return ""

    def line(self, now: float) -> str:
        parts = [self.label]
        if self.total:
            unit = f" {self.unit}" if self.unit else ""
            parts.append(f"{self.done:,.0f}/{self.total:,.0f}{unit} ({100 * self.done / self.total:.0f}%)")
        parts.append(format_seconds(now - self.start))
        eta = self.eta(now)
        return ", ".join(parts + ([eta] if eta else []))

    def tick(self) -> None:
        """Print a line when ``every`` seconds have passed since the last, and this is the innermost open task."""
        with self._lock:
            now = self.clock()
            if now - self.last < self.every or (_ACTIVE and _ACTIVE[-1] is not self):
                return
            self.last = now
            self.lines += 1
            text = self.line(now)
        self.logger.info("%s", text)

    def finish(self) -> None:
        """A last line when the task took longer than ``every`` (its time against the estimate)."""
        elapsed = self.clock() - self.start
        if elapsed >= self.every:
            estimated = f" (estimated {format_seconds(self.estimate)})" if self.estimate is not None else ""
            self.logger.info("%s: done in %s%s", self.label, format_seconds(elapsed), estimated)


@contextlib.contextmanager
def track(
    label: str,
    total: float | None = None,
    *,
    unit: str = "",
    estimate: float | None = None,
    every: float = EVERY_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    logger: logging.Logger = log,
    heartbeat: bool = True,
    done_line: bool = True,
) -> Iterator[Progress]:
    """A task open for the ``with`` block (``Progress``'s arguments): ``advance`` goes to it while it is the
    innermost; ``heartbeat``: a thread ticks it every ``every`` seconds; ``done_line``: its time at the end, when
    long."""
    task = Progress(label, total, unit=unit, estimate=estimate, every=every, clock=clock, logger=logger)
    _ACTIVE.append(task)
    stop = threading.Event()
    beat = None
    if heartbeat:
        beat = threading.Thread(target=_beat, args=(task, stop), name="progress", daemon=True)
        beat.start()
    try:
        yield task
    finally:
        stop.set()
        if beat is not None:
            beat.join()
        _ACTIVE.remove(task)
        if done_line:
            task.finish()


def _beat(task: Progress, stop: threading.Event) -> None:
    while not stop.wait(min(task.every, 5.0)):
        task.tick()


def advance(n: float = 1) -> None:
    """Count ``n`` units done of the innermost open task (none open: nothing)."""
    if _ACTIVE:
        _ACTIVE[-1].advance(n)
