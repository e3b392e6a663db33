"""The one error type of data_pipelines: bad or missing input, said in one message."""

from __future__ import annotations

__all__ = ["DatasetError"]


class DatasetError(ValueError):
    """Input that cannot become a dataset dir; the message names the file, line (or row) and field.

    Entry points print it without a traceback and exit 1. Raised before anything is written, so an
    earlier dataset dir stays as it was.
    """
