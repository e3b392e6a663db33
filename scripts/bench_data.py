"""Preparing an ml-25m-format dataset vs. just reading its ratings.csv with pyarrow.

    $ .venv/bin/python scripts/bench_data.py                          # 25M rows (~610 MiB CSV), 3 rounds
    $ .venv/bin/python scripts/bench_data.py --data /tmp/mlbench      # keep the generated files for next time
    $ .venv/bin/python scripts/bench_data.py --rows 2000000 --repeats 5   # quicker
    $ .venv/bin/python scripts/bench_data.py --rows 25000000 --repeats 1 --source interactions
    $ .venv/bin/python scripts/bench_data.py --generic --rows 200000000 --data /big/disk   # out of core

Generates ``<data>/ml-25m/ratings.csv`` (userId,movieId,rating,timestamp; 162,541 users and
59,047 movies like ml-25m, one rating per (user, movie), sorted by user then movie as GroupLens
ships it, uniform half-star ratings, so recbole's rating >= 3 keeps half of them)
and ``movies.csv`` (reused when ``--data`` already holds them for the same ``--rows``), then
warms the page cache with one untimed read and runs ``--repeats`` rounds of, each in a fresh
process (so peak RSS is its own):

1. ``pyarrow.csv.read_csv(ratings.csv)`` with default options (the bare read);
2. ``prepare_movielens("ml-25m", protocol=recbole, min_rating=3)``: checksum, parse,
   filter, ids, split, features, parquet (its previous output removed first: no cache hit);
   with ``--source interactions`` the generic source (``data=interactions``) on the same file.

The two alternate, so a busy machine slows both alike; the figure is the median over rounds
of prepare / read. Peak RSS is the child's ``ru_maxrss``. Target: ratio <= 2, peak < 6 GiB.
The last line is a JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NUM_USERS, NUM_MOVIES = 162_541, 59_047  # ml-25m
GIB = 1 << 30


def generate(folder: Path, rows: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    movie_ids = np.sort(rng.choice(209_171, NUM_MOVIES, replace=False)) + 1  # ml-25m's ids are sparse
    weights = rng.lognormal(0, 1.2, NUM_USERS)
    counts = rng.multinomial(rows, weights / weights.sum())
    users = np.repeat(np.arange(1, NUM_USERS + 1, dtype=np.int64), counts)
    popularity = 1.0 / np.arange(1, NUM_MOVIES + 1) ** 0.9
    items = rng.choice(NUM_MOVIES, rows, p=popularity / popularity.sum())
    # one rating per (user, movie), as in MovieLens: redraw repeated pairs uniformly until none is left
    while True:
        pairs = users * NUM_MOVIES + items
        order = np.argsort(pairs, kind="stable")
        repeated = np.zeros(rows, dtype=bool)
        repeated[order[1:][pairs[order][1:] == pairs[order][:-1]]] = True
        if not repeated.any():
            break
        items[repeated] = rng.integers(0, NUM_MOVIES, int(repeated.sum()))
    order = np.lexsort((items, users))  # GroupLens' order: by user, then movie
    users, items = users[order], movie_ids[items[order]]
    ratings = rng.integers(1, 11, rows) / 2.0
    timestamps = rng.integers(789_652_009, 1_574_327_703, rows)
    table = pa.table({"userId": users, "movieId": items, "rating": ratings, "timestamp": timestamps})
    with open(folder / "ratings.csv", "wb") as f:
        f.write(b"userId,movieId,rating,timestamp\n")
        pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=False))
    genres = ("Action", "Comedy", "Drama", "Romance", "Thriller", "Sci-Fi", "Documentary")
    with open(folder / "movies.csv", "w", encoding="utf-8") as f:
        f.write("movieId,title,genres\n")
        for m in movie_ids:
            g = "|".join(sorted({genres[m % 7], genres[(m // 7) % 7]}))
            f.write(f'{m},"Movie {m}, The ({1900 + m % 120})",{g}\n')


GENERIC_ROWS_PER_USER, GENERIC_ROWS_PER_ITEM = 40, 200  # 200M rows: 5M users, 1M items
_GENERIC_CHUNK = 10_000_000  # rows per generated parquet file (~0.5 GiB of memory while written)


def generate_generic(folder: Path, rows: int, seed: int = 0) -> None:
    """A generic-format log larger than the bench's memory target: a folder of parquet files (a
    warehouse export; CSV would be parsed on one core when streamed) with columns ``user, item,
    timestamp, rating``: sparse 64-bit user ids (a bijection of 0..U-1 mod 2^40), item ids 0..I-1,
    both skewed towards low indices (P(index < x) = sqrt(x / U), cube root for items), repeated
    pairs left in, rows in random order (not grouped by user, as a click log is written)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    num_users, num_items = max(rows // GENERIC_ROWS_PER_USER, 1), max(rows // GENERIC_ROWS_PER_ITEM, 1)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for part, start in enumerate(range(0, rows, _GENERIC_CHUNK)):
        n = min(_GENERIC_CHUNK, rows - start)
        user_index = (num_users * rng.random(n) ** 2).astype(np.int64)
        users = (user_index * 1_000_000_007 + 12_345) % (1 << 40) + (1 << 40)  # odd multiplier: distinct ids
        table = pa.table(
            {
                "user": users,
                "item": (num_items * rng.random(n) ** 3).astype(np.int64),
                "timestamp": rng.integers(1_500_000_000, 1_700_000_000, n),
                "rating": rng.integers(1, 6, n).astype(np.int8),
            }
        )
        pq.write_table(table, folder / f"part-{part:05d}.parquet", row_group_size=1 << 20, compression="snappy")


CHILD = {  # kind -> (imports, untimed; the timed statement)
    "read": ("import pyarrow.csv as c", "t = c.read_csv(sys.argv[1] + '/ml-25m/ratings.csv'); print(t.num_rows)"),
    "prepare": (
        "from data_pipelines.movielens import prepare_movielens",
        "print(prepare_movielens('ml-25m', root=sys.argv[1], protocol='recbole', min_rating=3.0, "
        "allow_download=False, progress=False))",
    ),
    # the generic source (data=interactions) on the same file, configured by column names
    "interactions": (
        "from data_pipelines.interactions import prepare_interactions; from data_pipelines.config import InteractionsDataConfig",
        "print(prepare_interactions(InteractionsDataConfig(path=sys.argv[1] + '/ml-25m/ratings.csv', user_column='userId', "
        "item_column='movieId', timestamp_column='timestamp', rating_column='rating', memory_budget_mb=int(sys.argv[4])), "
        "root=sys.argv[1], "
        "name='ml-25m', protocol='recbole', min_rating=3.0))",
    ),
    # --generic: the generic source on the generic-format log (recbole, no filter), bounded memory
    "generic": (
        "from data_pipelines.interactions import prepare_interactions; from data_pipelines.config import InteractionsDataConfig",
        "print(prepare_interactions(InteractionsDataConfig(path=sys.argv[1] + '/generic/log', user_column='user', "
        "item_column='item', timestamp_column='timestamp', rating_column='rating', memory_budget_mb=int(sys.argv[4])), "
        "root=sys.argv[1], "
        "name='generic', protocol='recbole'))",
    ),
}


def run_child(kind: str, root: Path, memory_budget_mb: int = 2048) -> tuple[float, float, str]:
    """(wall seconds of the statement alone, peak RSS GiB, stdout) of one fresh process doing ``kind``."""
    setup, statement = CHILD[kind]
    code = (
        "import time, resource, sys; exec(sys.argv[2]); _t = time.perf_counter(); exec(sys.argv[3]); "
        "print('BENCH', time.perf_counter() - _t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), setup, statement, str(memory_budget_mb)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("BENCH"))
    _, seconds, rss_kib = line.split()
    return float(seconds), int(rss_kib) * 1024 / GIB, out


def bench_generic(rows: int, data: Path | None, memory_budget_mb: int) -> None:
    """Generate (or reuse) ``<data>/generic/log.csv`` and prepare it once in a fresh process."""
    with tempfile.TemporaryDirectory() as tmp:
        root = data.absolute() if data else Path(tmp)
        log, stamp = root / "generic" / "log", root / "generic" / "bench.json"
        if not (stamp.is_file() and json.loads(stamp.read_text()) == {"rows": rows}):
            start = time.perf_counter()
            generate_generic(log, rows)
            stamp.write_text(json.dumps({"rows": rows}))
            print(f"generated {rows:,} rows in {time.perf_counter() - start:.1f}s", flush=True)
        for old in root.glob("generic-recbole-*"):
            shutil.rmtree(old)
        seconds, rss, out = run_child("generic", root, memory_budget_mb)
        meta = json.loads((Path(out.splitlines()[0]) / "meta.json").read_text())
        result = {
            "rows": rows,
            "source": "interactions (generic log)",
            "parquet_mib": round(sum(f.stat().st_size for f in log.iterdir()) / 2**20, 1),
            "prepare_s": round(seconds, 1),
            "rows_per_s": round(rows / seconds),
            "prepare_peak_rss_gib": round(rss, 3),
            "memory_budget_mb": memory_budget_mb,
            "num_buckets": meta["num_buckets"],
            "counts": meta["counts"],
            "num_users": meta["num_users"],
            "num_items": meta["num_items"],
            "meets_target": bool(rss < 4.0),
        }
        for old in root.glob("generic-recbole-*"):
            shutil.rmtree(old)
        print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=25_000_000, help="ratings to generate (ml-25m has 25,000,095)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of (read, prepare); the median is reported")
    parser.add_argument(
        "--source",
        choices=["movielens", "interactions"],
        default="movielens",
        help="which pipeline prepares the file: the MovieLens reader or the generic data=interactions source",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="folder for the generated files, kept (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--generic",
        action="store_true",
        help="prepare a generic-format log (a parquet folder) of --rows rows, larger than memory, with "
        "data=interactions, once, and report its time and peak RSS (target < 4 GiB); no bare read (it would "
        "hold the log in memory)",
    )
    parser.add_argument(
        "--memory-budget-mb",
        type=int,
        default=2048,
        help="data.interactions.memory_budget_mb for the generic source (default 2048, the config's)",
    )
    args = parser.parse_args()
    if args.generic:
        bench_generic(args.rows, args.data, args.memory_budget_mb)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data.absolute() if args.data else Path(tmp)
        folder, stamp = root / "ml-25m", root / "ml-25m" / "bench.json"
        if not (stamp.is_file() and json.loads(stamp.read_text()) == {"rows": args.rows}):
            start = time.perf_counter()
            generate(folder, args.rows)
            stamp.write_text(json.dumps({"rows": args.rows}))
            print(f"generated {args.rows:,} rows in {time.perf_counter() - start:.1f}s", flush=True)
        csv_bytes = (folder / "ratings.csv").stat().st_size
        run_child("read", root)  # warms the page cache
        reads, prepares, meta = [], [], {}
        for r in range(args.repeats):
            for old in root.glob("ml-25m-recbole-*"):
                shutil.rmtree(old)
            reads.append(run_child("read", root)[:2])
            kind = "prepare" if args.source == "movielens" else "interactions"
            prepare_s, prepare_rss, out = run_child(kind, root, args.memory_budget_mb)
            prepares.append((prepare_s, prepare_rss))
            meta = json.loads((Path(out.splitlines()[0]) / "meta.json").read_text())
            print(
                f"round {r + 1}: read {reads[-1][0]:.2f}s ({reads[-1][1]:.2f} GiB), prepare {prepare_s:.2f}s "
                f"({prepare_rss:.2f} GiB), ratio {prepare_s / reads[-1][0]:.2f}",
                flush=True,
            )
        for old in root.glob("ml-25m-recbole-*"):
            shutil.rmtree(old)
    ratios = [p[0] / r[0] for r, p in zip(reads, prepares)]
    ratio = statistics.median(ratios)
    prepare_peak = max(p[1] for p in prepares)
    result = {
        "rows": args.rows,
        "source": args.source,
        "csv_mib": round(csv_bytes / 2**20, 1),
        "repeats": args.repeats,
        "read_s": [round(r[0], 3) for r in reads],
        "prepare_s": [round(p[0], 3) for p in prepares],
        "ratios": [round(x, 3) for x in ratios],
        "median_read_s": round(statistics.median(r[0] for r in reads), 3),
        "median_prepare_s": round(statistics.median(p[0] for p in prepares), 3),
        "median_ratio": round(ratio, 3),
        "read_peak_rss_gib": round(max(r[1] for r in reads), 3),
        "prepare_peak_rss_gib": round(prepare_peak, 3),
        "counts": meta["counts"],
        "num_users": meta["num_users"],
        "num_items": meta["num_items"],
        "meets_target": bool(ratio <= 2.0 and prepare_peak < 6.0),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
