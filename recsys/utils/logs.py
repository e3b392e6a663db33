"""What a run prints: recsys's own progress and results on the console, library chatter in the log file.

Hydra gives every entry point a console handler and a file handler (``runs/<name>/train.log``)
on the root logger. :func:`setup_logging` (called first thing in each entry point's ``main``):

- keeps the console for recsys's own loggers (``recsys.*``, ``data_pipelines.*``, scripts) and
  for errors from anyone; torchrec's planner box, fbgemm's TBE argument dumps, faiss' loader
  lines and library warnings go to the log file only;
- on ranks other than 0 keeps only recsys's own warnings and anyone's errors, on the console and
  in the log file (library chatter once, from rank 0; a rank's own trouble, e.g. an injected
  fault, still in the shared log), so a torchrun job does not print each warning once per rank;
- routes torch's own handler (its ``[rank0]:W...`` lines) and Python warnings through the same
  handlers, and ignores the few library warnings that are known to be harmless here
  (:data:`KNOWN_HARMLESS_WARNINGS`, each with its reason).

A recsys record that belongs in the log file only passes ``extra=FILE_ONLY``.
"""

from __future__ import annotations

import logging
import warnings

OWN_LOGGERS = ("recsys", "data_pipelines", "__main__")  # first component of a logger name the console shows
FILE_ONLY = {"console": False}  # logging extra: this record goes to the log file, not the console

# (category, message regex, why it is harmless here). Each is raised inside torchrec / torch on
# every run, by code recsys cannot change; none of them asks the user to do anything.
KNOWN_HARMLESS_WARNINGS = (
    # torchrec 1.8's sharded tables, optimizer state and DCP checkpoints are ShardedTensors; torch
    # deprecates them for DTensor, which torchrec has not switched to yet.
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor"),
    # torchrec's planner builds HeuristicalStorageReservation itself (it is the planner's
    # default); its over-estimate concerns meta-device dry runs and errs on the safe side.
    (FutureWarning, r"HeuristicalStorageReservation is known to cause issues"),
    # DistributedModelParallel wraps the towers in DDP with broadcast_buffers; the towers have no buffers.
    (FutureWarning, r"`broadcast_buffers` is deprecated"),
)


class ConsoleFilter(logging.Filter):
    """Passes recsys's own records (unless marked FILE_ONLY) and any record at ERROR or above."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return getattr(record, "console", True) and record.name.split(".")[0] in OWN_LOGGERS


def ignore_known_warnings() -> None:
    for category, message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def setup_logging(rank: int) -> None:
    """Console / log-file split described in the module docstring; call after Hydra set up logging."""
    root = logging.getLogger()
    for handler in root.handlers:
        # the log file of rank 0 takes everything; other ranks' library chatter would repeat it once per rank
        if (_is_console(handler) or rank != 0) and not any(isinstance(f, ConsoleFilter) for f in handler.filters):
            handler.addFilter(ConsoleFilter())
    if rank != 0:
        root.setLevel(logging.WARNING)
    # torch attaches its own stderr handler to the "torch" logger (no propagation): its
    # "[rank0]:W..." lines bypass the root handlers. Send them through the root like any library's.
    torch_logger = logging.getLogger("torch")
    for handler in list(torch_logger.handlers):
        if _is_console(handler):
            torch_logger.removeHandler(handler)
    torch_logger.propagate = True
    logging.captureWarnings(True)  # warnings.warn -> logger "py.warnings" -> the log file
    ignore_known_warnings()
