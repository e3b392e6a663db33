"""The error types of data_pipelines: bad or missing input, or a config value that cannot work,
said in one message."""

from __future__ import annotations

__all__ = ["ConfigError", "DatasetError", "one_line"]


class DatasetError(ValueError):
    """Input that cannot become a dataset dir; the message names the file, line (or row) and field.

    Entry points print it without a traceback and exit 1. Raised before anything is written, so an
    earlier dataset dir stays as it was.
    """


class ConfigError(ValueError):
    """A config value (or a key) that cannot work; the message names the key and the value.

    Entry points print it as one line without a traceback and exit 1, like a ``DatasetError``.
    """


def one_line(error: BaseException) -> str:
    """The error's message on one line (Hydra's and OmegaConf's span several)."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())
