"""The adjacency lists of LightGCN-family benchmarks: ``user item item ...`` per line."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_pipelines.errors import DatasetError
from data_pipelines.readers.delimited import open_text

_ADJACENCY_HINT = (
    "adjacency lists are `user item item ...` per line, integers apart by spaces; for a CSV / TSV log "
    "set data.interactions.format=csv or tsv"
)
_INTEGER_TOKEN = r"^[+-]?[0-9]+$"


def read_adjacency(path: str | os.PathLike) -> pa.Table:
    """A LightGCN-style file: one line per user, ``user item item ...``, space-separated integers.

    Returns columns ``user``, ``item`` (the tokens as text: ``log_columns.ids`` reads them by the
    id rule, so "007" and "7" stay two ids unless ``id_type=int``) and ``position`` (the pair's
    running index in the file, which orders a user's items when the data has no timestamps). A
    line with a user and no items adds nothing; blank lines are skipped.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    users: list[str] = []
    items: list[str] = []
    lines: list[int] = []  # the line of each user's run of items: first pair index -> line
    starts: list[int] = []
    try:
        with open_text(path) as f:
            for line_no, line in enumerate(f, start=1):
                tokens = line.split()
                if len(tokens) < 2:
                    if len(tokens) == 1 and not _is_integer(tokens[0]):
                        raise DatasetError(
                            f"{path}: line {line_no}: user id {tokens[0]!r} is not an integer; {_ADJACENCY_HINT}"
                        )
                    continue
                lines.append(line_no)
                starts.append(len(items))
                users.extend([tokens[0]] * (len(tokens) - 1))
                items.extend(tokens[1:])
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e})") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e})") from None
    if not users:
        raise DatasetError(f"{path}: no interactions (every line is empty or a user without items)")
    user, item = pa.array(users, pa.string()), pa.array(items, pa.string())
    for field, column in (("user id", user), ("item id", item)):
        bad = pc.invert(pc.match_substring_regex(column, _INTEGER_TOKEN))
        if pc.any(bad).as_py():
            pair = int(pc.index(bad, True).as_py())
            line_no = lines[int(np.searchsorted(starts, pair, side="right")) - 1]
            raise DatasetError(
                f"{path}: line {line_no}: {field} {column[pair].as_py()!r} is not an integer; {_ADJACENCY_HINT}"
            )
    return pa.table({"user": user, "item": item, "position": np.arange(len(users), dtype=np.int64)})


def _is_integer(token: str) -> bool:
    return token.lstrip("+-").isdigit()
