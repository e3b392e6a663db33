"""A cut-down sample of a LightGCN-format dataset (train.txt / test.txt: a user id, then their item ids, per line): the
N users with the most training items and the M items those users interact with most, re-indexed from 0; a user left
without a training or a test item is dropped. The denser, smaller regime the defaults are checked on besides the full
benchmarks (docs/quality.md, "EASE in the served fusion").

$ python scripts/cut_sample.py ../shared/data/gowalla data/cuts/gowalla_2k --users 2000 --items 2000
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path


def read_adjacency(path: Path) -> dict[int, list[int]]:
    """user -> items of one LightGCN-format file; a line that is not integers is an error naming the file and line."""
    out: dict[int, list[int]] = {}
    with path.open() as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                ids = [int(v) for v in fields]
            except ValueError:
                raise ValueError(
                    f"{path}:{number}: expected a user id and item ids (integers), got {line.strip()!r}"
                ) from None
            out.setdefault(ids[0], []).extend(ids[1:])
    return out


def cut(train: dict[int, list[int]], test: dict[int, list[int]], users: int, items: int) -> tuple[list, list]:
    """(train rows, test rows) of the sample, each row [user, items...] in the new ids."""
    chosen = sorted(train, key=lambda u: (-len(train[u]), u))[:users]
    counts = Counter(i for u in chosen for i in train[u] + test.get(u, []))
    top = sorted(counts, key=lambda i: (-counts[i], i))[:items]
    index = {item: k for k, item in enumerate(sorted(top))}
    train_rows, test_rows = [], []
    for user in sorted(chosen):
        train_items = [index[i] for i in train[user] if i in index]
        test_items = [index[i] for i in test.get(user, []) if i in index]
        if train_items and test_items:
            new_id = len(train_rows)
            train_rows.append([new_id, *train_items])
            test_rows.append([new_id, *test_items])
    return train_rows, test_rows


def write_rows(rows: list[list[int]], path: Path) -> None:
    """The rows as a LightGCN-format file, written to a temporary path and renamed (never half written)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.writelines(" ".join(map(str, row)) + "\n" for row in rows)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a folder with train.txt and test.txt")
    parser.add_argument("dest", type=Path, help="the sample's folder (created)")
    parser.add_argument("--users", type=int, default=2000, help="the most active users kept")
    parser.add_argument("--items", type=int, default=2000, help="their most frequent items kept")
    args = parser.parse_args(argv)
    train, test = (read_adjacency(args.source / name) for name in ("train.txt", "test.txt"))
    train_rows, test_rows = cut(train, test, args.users, args.items)
    args.dest.mkdir(parents=True, exist_ok=True)
    write_rows(train_rows, args.dest / "train.txt")
    write_rows(test_rows, args.dest / "test.txt")
    sizes = {
        "users": len(train_rows),
        "items": len({i for row in train_rows + test_rows for i in row[1:]}),
        "train": sum(len(r) - 1 for r in train_rows),
        "test": sum(len(r) - 1 for r in test_rows),
    }
    print(f"{args.dest}: {sizes['users']} users, {sizes['items']} items, {sizes['train']} train, {sizes['test']} test")
    return sizes


if __name__ == "__main__":
    main()
