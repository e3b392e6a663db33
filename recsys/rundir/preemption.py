"""Preemption: on SIGTERM, finish the current step, checkpoint, and exit with a status of its own.

Kubernetes, Slurm and torchrun's agent send SIGTERM some seconds before SIGKILL. Without a handler
the run dies at once and loses every step since its last checkpoint. With one (installed by the
trainer while it trains), the signal only sets a flag; after each step the ranks agree on it, write a
checkpoint together and stop with :class:`Preempted`, which ``recsys.train`` turns into exit status
:data:`PREEMPTED_EXIT_CODE`. A rerun (``trainer.resume=auto``) continues at the next unseen batch.

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


class Preempted(Exception):
    """Training stopped on SIGTERM after writing ``checkpoint`` (the run resumes from it)."""

    def __init__(self, step: int, checkpoint: str) -> None:
        super().__init__(
            f"preempted (SIGTERM): stopped after step {step}, checkpoint {checkpoint}; "
            "run the same command again to resume from it"
        )
        self.step, self.checkpoint = step, checkpoint


# steps between the ranks' agreements on a stop: milliseconds each on a GPU, well inside any grace period on CPU
COLLECTIVE_EVERY_STEPS = 16


class PreemptionHandler:
    """Context manager: SIGTERM sets a flag (and starts the grace-period watchdog) instead of killing."""

    def __init__(
        self, grace_s: float, *, rank: int = 0, world_size: int = 1, device: torch.device = torch.device("cpu")
    ) -> None:
        self.grace_s = grace_s
        self.rank, self.world_size, self.device = rank, world_size, device
        self.requested = False
        self._previous = None  # the SIGTERM handler before install (may itself be None: set outside Python)
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
                self._previous = signal.signal(signal.SIGTERM, self._on_signal)
            except ValueError:  # not the main thread: signals cannot be handled here
                log.warning("trainer.preemption_grace_s: not on the main thread, SIGTERM is not handled")
                return
            self._installed = True
            # A Python signal handler runs only when the main thread returns to the interpreter: a rank blocked
            # in a collective whose peer died never would. The C-level handler also writes the signal number to
            # the wakeup fd, which a watcher thread reads: the grace-period watchdog starts regardless.
            self._reader, writer = socket.socketpair()
            writer.setblocking(False)
            self._writer = writer
            self._previous_wakeup_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            threading.Thread(target=self._watch, args=(self._reader,), name="sigterm-watcher", daemon=True).start()

    def restore(self) -> None:
        """The previous SIGTERM handler back (idempotent)."""
        with self._lock:
            if self._installed:
                signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
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
                if signal.SIGTERM in data:
                    self._on_signal(signal.SIGTERM, None)

    def _on_signal(self, signum, frame) -> None:
        with self._lock:  # from the main thread's handler and from the watcher: whichever comes first
            if self.requested or not self._installed:
                return
            self.requested = True
            self._watchdog = threading.Timer(self.grace_s, self._expire)
            self._watchdog.daemon = True
            self._watchdog.start()
        log.warning(
            "SIGTERM on rank %d: finishing the current step, then checkpointing (at most %.0f s)",
            self.rank,
            self.grace_s,
        )

    def _expire(self) -> None:
        log.error(
            "SIGTERM: no checkpoint within trainer.preemption_grace_s=%s s; exiting with status %d without one "
            "(the run resumes from its previous checkpoint)",
            self.grace_s,
            PREEMPTED_EXIT_CODE,
        )
        logging.shutdown()
        os._exit(PREEMPTED_EXIT_CODE)

    def should_stop(self, step: int | None = None) -> bool:
        """Collective: whether any rank got SIGTERM (every rank must stop at the same step to checkpoint together).

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
