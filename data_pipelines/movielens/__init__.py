"""MovieLens (GroupLens) releases -> dataset dirs, in each release's own file format.

    $ python -m data_pipelines.prepare data=movielens_1m                      # recbole, seed 0
    $ python -m data_pipelines.prepare data=movielens_20m data/protocol=strong_generalization

    >>> prepare_movielens("ml-100k", root="data", protocol="loo")   # -> data/ml-100k-loo-<key>

Sources (``RELEASES``), looked for in ``root`` in this order: the extracted folder
(``<root>/ml-1m/ratings.dat``; ml-10m's folder is ``ml-10M100K``), the official zip
(``<root>/ml-1m.zip``), else a verified download of the official zip into ``root``.

| release | ratings | items | users | separator, encoding |
|---|---|---|---|---|
| ml-100k | u.data (user item rating ts) | u.item (id, title, dates, url, 19 genre flags) | u.user (id age gender occupation zip) | tab / `|`, latin-1 |
| ml-1m   | ratings.dat | movies.dat (id, title, `|` genres) | users.dat (id gender age occupation zip) | `::`, latin-1 |
| ml-10m  | ratings.dat (half stars) | movies.dat | - | `::` |
| ml-20m, ml-25m, ml-latest-small | ratings.csv (header userId,movieId,rating,timestamp) | movies.csv (movieId,title,genres; titles quoted when they hold commas) | - | `,`, utf-8 |

Text files are decoded as utf-8 when they are valid utf-8, else latin-1.

Pipeline: parse (pyarrow, typed columns; the min-rating filter applied batch by batch as the
columns are copied out) -> ``filter_interactions`` (min rating, dedupe, k-core) -> contiguous ids
(raw ids ascending) -> the split protocol -> ids compacted again if the protocol dropped any
-> features -> ``write_dataset_dir``. The sources' sha256 is computed on a second thread unless
a prepared dir of the same release and protocol exists (then first: it may be a cache hit); the
movies and users files are parsed on that thread too.
Speed and memory: see ``scripts/bench_data.py`` and data_pipelines/README.md. Outputs beyond the
dataset-dir contract:

    items.parquet        + title (str), year (int64, 0 = none in the title),
                           year_bucket (int64: 0 = unknown, 1 = < 1920, 2 = 1920s, ..., 12 = >= 2020)
    users.parquet        + gender (0 F, 1 M), age_bucket (0 = < 18, 1 = 18-24, 2 = 25-34, 3 = 35-44,
                           4 = 45-49, 5 = 50-55, 6 = 56+), occupation (index into vocab/occupations)
                           for ml-100k and ml-1m only
    vocab/users.parquet       raw_id -> user_id
    vocab/items.parquet       raw_id -> item_id, title, genres (the raw "|"-joined string)
    vocab/categories.parquet  category_id -> name (genres sorted by name; "(no genres listed)" when used)
    vocab/occupations.parquet occupation -> name (ml-100k, ml-1m)
    heldout_users.parquet     user_id, split ("valid" | "test"): strong_generalization only

Bad input raises ``MovieLensError`` naming the file, line and field, before anything is
written: the previous dataset dir (if any) stays as it was.
"""

from __future__ import annotations

from data_pipelines.movielens.parse import read_release
from data_pipelines.movielens.prepare import cache_key, prepare_movielens
from data_pipelines.movielens.releases import (
    AGE_BUCKET_EDGES,
    BASE_URL,
    GENDERS,
    ML1M_OCCUPATIONS,
    ML100K_GENRES,
    NO_GENRE,
    PIPELINE_VERSION,
    RELEASES,
    YEAR_BUCKET_EDGES,
    MovieLensError,
    Release,
    locate_source,
)  # fmt: skip

__all__ = [
    "AGE_BUCKET_EDGES",
    "BASE_URL",
    "GENDERS",
    "ML1M_OCCUPATIONS",
    "ML100K_GENRES",
    "NO_GENRE",
    "PIPELINE_VERSION",
    "RELEASES",
    "YEAR_BUCKET_EDGES",
    "MovieLensError",
    "Release",
    "cache_key",
    "locate_source",
    "prepare_movielens",
    "read_release",
]
