"""Preemption: on SIGTERM (or Ctrl-C), finish the current step, checkpoint, and exit with a status of its own.

Kubernetes, Slurm and torchrun's agent send SIGTERM some seconds before SIGKILL. Without a handler
the run dies at once and loses every step since its last checkpoint. With one (installed by the
trainer while it trains), the signal only sets a flag; after each step the ranks agree on it, write a
checkpoint together and stop with :class:`Preempted`, which ``recsys.train`` turns into exit status
:data:`PREEMPTED_EXIT_CODE`. A rerun (``trainer.resume=auto``) continues at the next unseen batch.

Ctrl-C (SIGINT) is handled the same way, with the shell's status for it (130) and one line instead of a
``KeyboardInterrupt`` traceback; a second Ctrl-C exits at once, without a checkpoint (the previous one is intact).

``trainer.preemption_grace_s`` bounds the time from the signal to the exit: set it below the
scheduler's own grace period (Kubernetes: 30 s by default). If the step and the checkpoint have not
finished by then, the process exits with the same status without a new checkpoint (the previous one
is intact: checkpoints are renamed into place only when complete). That includes a rank blocked in
a collective whose peer died (torchrun SIGTERMs it to restart the job): it exits after the grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# EX_TEMPFAIL (sysexits.h): "try again later" -- not a success (0) and not a failure (1) to debug
PREEMPTED_EXIT_CODE = 75
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a program stopped by Ctrl-C
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    return INTERRUPTED_EXIT_CODE if signum == signal.SIGINT else PREEMPTED_EXIT_CODE


def signal_name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"


class Preempted(Exception):
    """Training stopped on SIGTERM or Ctrl-C after writing ``checkpoint`` (the run resumes from it)."""

    def __init__(
        self,
        step: int,
        checkpoint: str,
        signum: int = signal.SIGTERM,
        then: str = "run the same command again to resume from it",
    ) -> None:
        """``then``: what the same command does next (a search's trial is not resumed: recsys/tune/search.py)."""
        how = "interrupted (Ctrl-C)" if signum == signal.SIGINT else "preempted (SIGTERM)"
        super().__init__(f"{how}: stopped after step {step}, checkpoint {checkpoint}; {then}")
        self.step, self.checkpoint, self.signum, self.exit_code = step, checkpoint, signum, exit_code(signum)


# steps between the ranks' agreements on a stop: milliseconds each on a GPU, well inside any grace period on CPU
COLLECTIVE_EVERY_STEPS = 16


class PreemptionHandler:
    """Context manager: SIGTERM or SIGINT sets a flag (and starts the grace-period watchdog) instead of killing."""

    def __init__(
        self, grace_s: float, *, rank: int = 0, world_size: int = 1, device: torch.device = torch.device("cpu")
    ) -> None:
        self.grace_s = grace_s
        self.rank, self.world_size, self.device = rank, world_size, device
        self.requested = False
        self.signum = signal.SIGTERM  # the signal that asked for the stop
        self._previous: dict = {}  # the handlers before install (each may be None: set outside Python)
        self._interrupts = 0  # Ctrl-Cs seen by the watcher: the second exits at once
        self._installed = False
        self._lock = threading.Lock()
        self._watchdog: threading.Timer | None = None

    def __enter__(self) -> PreemptionHandler:
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def install(self) -> None:
        if self.grace_s > 0 and not self._installed:
            try:
                self._previous = {signum: signal.signal(signum, self._on_signal) for signum in SIGNALS}
            except ValueError:  # not the main thread: signals cannot be handled here
                log.warning("trainer.preemption_grace_s: not on the main thread, SIGTERM and Ctrl-C are not handled")
                return
            self._installed = True
            # A Python signal handler runs only when the main thread returns to the interpreter: a rank blocked
            # in a collective whose peer died never would. The C-level handler also writes the signal number to
            # the wakeup fd, which a watcher thread reads: the grace-period watchdog starts regardless.
            self._reader, writer = socket.socketpair()
            writer.setblocking(False)
            self._writer = writer
            self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(self._reader,), name="signal-watcher", daemon=True).start()

    def restore(self) -> None:
        """The previous SIGTERM and SIGINT handlers back (idempotent)."""
        with self._lock:
            if self._installed:
                for signum, previous in self._previous.items():
                    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
                signal.set_wakeup_fd(self._previous_wakeup_fd)
                self._writer.close()  # the watcher's recv returns b"": it exits
                self._installed = False
            if self._watchdog is not None:
                self._watchdog.cancel()

    def _watch(self, reader: socket.socket) -> None:
        with reader:
            while True:
                try:
                    data = reader.recv(64)
                except OSError:
                    return
                if not data:
                    return
                self._interrupts += data.count(signal.SIGINT)
                if self._interrupts >= 2:  # the user insists: stop now, as Ctrl-C would without the handler
                    self._exit(signal.SIGINT, "a second Ctrl-C: exiting with status %d without a new checkpoint")
                for signum in SIGNALS:
                    if signum in data:
                        self._on_signal(signum, None)

    def _on_signal(self, signum, frame) -> None:
        with self._lock:  # from the main thread's handler and from the watcher: whichever comes first
            if self.requested or not self._installed:
                return
            self.requested, self.signum = True, signum
            self._watchdog = threading.Timer(self.grace_s, self._expire)
            self._watchdog.daemon = True
            self._watchdog.start()
        log.warning(
            "%s on rank %d: finishing the current step, then checkpointing (at most %.0f s)%s",
            signal_name(signum),
            self.rank,
            self.grace_s,
            "; Ctrl-C again exits at once, without a checkpoint" if signum == signal.SIGINT else "",
        )

    def _expire(self) -> None:
        self._exit(
            self.signum,
            f"no checkpoint within trainer.preemption_grace_s={self.grace_s} s; exiting with status %d without one",
        )

    @staticmethod
    def _exit(signum: int, why: str) -> None:
        """Exit now (``why``: a %d for the status), the previous checkpoint kept for the rerun."""
        log.error(f"{signal_name(signum)}: {why} (the run resumes from its previous checkpoint)", exit_code(signum))
        logging.shutdown()
        os._exit(exit_code(signum))

    def should_stop(self, step: int | None = None) -> bool:
        """Collective: whether any rank got SIGTERM or Ctrl-C (every rank must stop at the same step to checkpoint together).

        ``step``: the training step just done; with several ranks they agree every ``COLLECTIVE_EVERY_STEPS`` steps
        only (the all-reduce and its read-back are a host sync: every step, a GPU would wait on them), so a stop
        comes that many steps later at most. None (after validation): always."""
        if self.grace_s <= 0:
            return False
        if self.world_size == 1:
            return self.requested
        if step is not None and step % COLLECTIVE_EVERY_STEPS:
            return False
        flag = torch.tensor([1 if self.requested else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
