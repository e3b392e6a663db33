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

import csv
import hashlib
import io
import json
import math
import os
import re
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from data_pipelines.dataset_dir import CODE_VERSION, is_complete, is_prepared, write_dataset_dir
from data_pipelines.download import DownloadError, download, sha256_file
from data_pipelines.errors import DatasetError
from data_pipelines.splits import PROTOCOLS, filter_interactions, split

__all__ = [
    "BASE_URL",
    "RELEASES",
    "MovieLensError",
    "Release",
    "cache_key",
    "locate_source",
    "prepare_movielens",
    "read_release",
]

BASE_URL = "https://files.grouplens.org/datasets/movielens"
PIPELINE_VERSION = "movielens/1"  # bump when this module's output for the same input changes
NO_GENRE = "(no genres listed)"  # ml-20m's own name for a movie without genres; used for every release
YEAR_BUCKET_EDGES = tuple(range(1920, 2030, 10))  # decade starts; bucket 1 is before 1920, 12 from 2020
AGE_BUCKET_EDGES = (18, 25, 35, 45, 50, 56)  # ml-1m's age groups; ml-100k's ages are cut the same way
GENDERS = {"F": 0, "M": 1}
ML100K_GENRES = (  # u.genre, in the order of u.item's 19 flags
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
    "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
ML1M_OCCUPATIONS = (  # ml-1m README: users.dat occupation codes 0..20
    "other or not specified", "academic/educator", "artist", "clerical/admin", "college/grad student",
    "customer service", "doctor/health care", "executive/managerial", "farmer", "homemaker", "K-12 student",
    "lawyer", "programmer", "retired", "sales/marketing", "scientist", "self-employed", "technician/engineer",
    "tradesman/craftsman", "unemployed", "writer",
)
_YEAR = re.compile(r"\((\d{4})(?:[-\u2013]\d{0,4})?\)\s*$")  # "Toy Story (1995)", "Babylon 5 (1994-1998)"
_RATINGS_BLOCK_BYTES = 1 << 24  # CSV bytes per Arrow batch (~640k ml-25m rows)
_RELEASE_EVERY_BATCHES = 4  # hand freed Arrow memory back to the OS this often while copying batches out
_RAW_ID_LOOKUP_LIMIT = 1 << 27  # raw ids below this map through a dense lookup array (<= 1 GiB)


class MovieLensError(DatasetError):
    """Bad or missing MovieLens input; the message names the file (and line and field)."""


@dataclass(frozen=True)
class Release:
    name: str  # "ml-1m": the zip is <name>.zip
    folders: tuple[str, ...]  # folder names the zip extracts to (first = the zip's own)
    layout: str  # "100k" | "dat" | "csv"
    ratings: str
    movies: str
    users: str | None  # None: the release has no user file
    md5: str | None  # GroupLens' published md5 of the zip (<name>.zip.md5); None: none fixed


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release("ml-100k", ("ml-100k",), "100k", "u.data", "u.item", "u.user", "0e33842e24a9c977be4e0107933c0723"),
        Release("ml-1m", ("ml-1m",), "dat", "ratings.dat", "movies.dat", "users.dat", "c4d9eecfca2ab87c1945afe126590906"),
        Release("ml-10m", ("ml-10M100K", "ml-10m"), "dat", "ratings.dat", "movies.dat", None, "ce571fd55effeba0271552578f2648bd"),
        Release("ml-20m", ("ml-20m",), "csv", "ratings.csv", "movies.csv", None, "cd245b17a1ae2cc31bb14903e1204af3"),
        Release("ml-25m", ("ml-25m",), "csv", "ratings.csv", "movies.csv", None, "6b51fb2759a8657d3bfcbfc42b592ada"),
        # ml-latest-small is re-issued from time to time: no fixed checksum, its sha256 is recorded
        Release("ml-latest-small", ("ml-latest-small",), "csv", "ratings.csv", "movies.csv", None, None),
    )
}


# ---------------------------------------------------------------- sources


class _Source:
    """One release's files, from a folder or a zip."""

    label: str

    def describe(self, file: str) -> str:
        raise NotImplementedError

    def read_bytes(self, file: str) -> bytes:
        raise NotImplementedError

    def path(self, file: str) -> Path | None:
        return None

    def checksums(self) -> list[dict[str, str]]:
        raise NotImplementedError


class _FolderSource(_Source):
    def __init__(self, folder: Path, files: tuple[str, ...]):
        self.folder, self.files, self.label = folder, files, str(folder)

    def describe(self, file: str) -> str:
        return str(self.folder / file)

    def read_bytes(self, file: str) -> bytes:
        return (self.folder / file).read_bytes()

    def path(self, file: str) -> Path | None:
        return self.folder / file

    def checksums(self) -> list[dict[str, str]]:
        return [{"file": f"{self.folder.name}/{f}", "sha256": sha256_file(self.folder / f)} for f in self.files]


class _ZipSource(_Source):
    def __init__(self, zip_path: Path, release: Release, files: tuple[str, ...], how: str):
        self.zip_path, self.label, self.how = zip_path, str(zip_path), how
        try:
            with zipfile.ZipFile(zip_path) as zf:
                names = zf.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise MovieLensError(
                f"{zip_path}: not a readable zip ({e}): truncated or corrupt. Delete it, or replace it with "
                f"{BASE_URL}/{release.name}.zip (or put its extracted folder {release.folders[0]}/ beside it)"
            ) from None
        self.members: dict[str, str] = {}
        for f in files:
            wanted = [f"{d}/{f}" for d in release.folders] + [f]
            found = next((n for n in wanted if n in names), None)
            if found is None:
                raise MovieLensError(f"{zip_path}: no {wanted[0]} inside (is this the {release.name} zip?)")
            self.members[f] = found

    def describe(self, file: str) -> str:
        return f"{self.zip_path}:{self.members[file]}"

    def read_bytes(self, file: str) -> bytes:
        try:
            with zipfile.ZipFile(self.zip_path) as zf:
                return zf.read(self.members[file])
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as e:
            raise MovieLensError(f"{self.describe(file)}: corrupt zip member ({e}); delete {self.zip_path} and run again") from None

    def checksums(self) -> list[dict[str, str]]:
        return [{"file": self.zip_path.name, "sha256": sha256_file(self.zip_path), "from": self.how}]


def _release_files(release: Release) -> tuple[str, ...]:
    return tuple(f for f in (release.ratings, release.movies, release.users) if f)


def locate_source(release: Release, root: str | os.PathLike, *, url: str = "", md5: str = "",
                  allow_download: bool = True, progress: bool = True) -> _Source:
    """The extracted folder in ``root``, else ``<root>/<name>.zip``, else a verified download of it.

    ``url``: "" = ``BASE_URL/<name>.zip``. ``md5``: "" = the release's published md5 (if any),
    "skip" = no check, else the expected hex digest. Raises MovieLensError saying where to put
    the file when there is no copy and no download.
    """
    root = Path(root).absolute()
    files = _release_files(release)
    incomplete = None
    for folder in release.folders:
        d = root / folder
        if d.is_dir():
            missing = [f for f in files if not (d / f).is_file()]
            if not missing:
                return _FolderSource(d, files)
            incomplete = (d, missing)
    zip_path = root / f"{release.name}.zip"
    if zip_path.is_file():
        return _ZipSource(zip_path, release, files, "local")
    official = f"{BASE_URL}/{release.name}.zip"
    where = (
        f"put {release.name}.zip (from {official}) or its extracted folder {release.folders[0]}/ "
        f"({', '.join(files)}) in {root}"
    )
    if incomplete is not None:
        where = f"{incomplete[0]} lacks {', '.join(incomplete[1])}; " + where
    if not allow_download:
        raise MovieLensError(f"{release.name}: no local copy and downloads are off (data.movielens.download=false): {where}")
    expected = None if md5 == "skip" else (md5 or release.md5)

    def validate(tmp: Path) -> None:
        try:
            _ZipSource(tmp, release, files, "download")
        except MovieLensError as e:
            raise DownloadError(f"downloaded {url or official} is not the {release.name} zip: {e}") from None

    try:
        download(url or official, zip_path, md5=expected, validate=validate, progress=progress)
    except DownloadError as e:
        raise MovieLensError(f"{e}\n{release.name}: {where}, then run again") from None
    return _ZipSource(zip_path, release, files, f"download {url or official}" + (f" md5 {expected}" if expected else ""))


# ---------------------------------------------------------------- parsing


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _check_fields(label: str, line_no: int, parts: list[str], names: tuple[str, ...], sep: str, line: str) -> None:
    if len(parts) != len(names):
        raise MovieLensError(
            f"{label} line {line_no}: expected {len(names)} fields ({', '.join(names)}) separated by {sep!r}, "
            f"got {len(parts)}: {line[:100]!r}"
        )


def _as_int(label: str, line_no: int, field: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise MovieLensError(f"{label} line {line_no}, field {field!r}: {value!r} is not an integer") from None


RATING_MIN, RATING_MAX = 0.5, 5.0  # GroupLens' star scale: whole stars in 100k / 1m, half stars from 10m on


def _as_rating(label: str, line_no: int, field: str, value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise MovieLensError(f"{label} line {line_no}, field {field!r}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise MovieLensError(f"{label} line {line_no}, field {field!r}: {value!r} is not a finite number")
    if not RATING_MIN <= x <= RATING_MAX:
        raise MovieLensError(f"{label} line {line_no}, field {field!r}: {value!r} is outside [{RATING_MIN}, {RATING_MAX}]")
    return x


_RATING_FIELDS = ("user", "item", "rating", "timestamp")


def _locate_bad_rating_line(label: str, text: str, sep: str, names: tuple[str, ...], first_line: int) -> None:
    """Slow path after a fast parse failed: raise naming the first bad line and field."""
    kinds = ("int", "int", "rating", "int")
    for line_no, line in enumerate(text.splitlines()[first_line - 1 :], start=first_line):
        if not line.strip():
            continue
        parts = line.split(sep)
        _check_fields(label, line_no, parts, names, sep, line)
        for field, kind, value in zip(names, kinds, parts):
            (_as_rating if kind == "rating" else _as_int)(label, line_no, field, value.strip())


def _read_ratings(src: _Source, release: Release) -> pd.DataFrame:
    """Raw ratings: user_id, item_id (raw int64 ids), timestamp int64, rating float32."""
    return _ratings_frame(_ratings_table(src, release).to_batches())


def _ratings_frame(batches: list[pa.RecordBatch], *, min_rating: float = 0.0) -> pd.DataFrame:
    """``_ratings_table``'s batches as ``_read_ratings``' frame, optionally filtered by rating.

    ``min_rating`` > 0 keeps only the rows whose float32 rating is >= it (exactly
    ``filter_interactions``' first step). Consumes ``batches``: each is dropped once copied and
    Arrow's freed memory handed back to the OS, so the numpy columns reuse those pages (on a
    VM several times faster than fresh ones) and the file never exists twice in memory.
    """
    # columns user_id, item_id, rating, timestamp
    keep = [b.column(2).to_numpy().astype(np.float32) >= min_rating if min_rating > 0 else None for b in batches]
    counts = [b.num_rows if k is None else int(np.count_nonzero(k)) for b, k in zip(batches, keep)]
    columns = [np.empty(sum(counts), dtype=np.float32 if i == 2 else np.int64) for i in range(4)]
    at = 0
    for j, (k, count) in enumerate(zip(keep, counts)):
        for i, out in enumerate(columns):
            values = batches[j].column(i).to_numpy()
            out[at : at + count] = values if k is None else np.compress(k, values)  # rating: float64 -> float32
        at += count
        batches[j] = None
        if j % _RELEASE_EVERY_BATCHES == _RELEASE_EVERY_BATCHES - 1:
            pa.default_memory_pool().release_unused()
    pa.default_memory_pool().release_unused()
    user_ids, item_ids, ratings, timestamps = columns
    return pd.DataFrame(
        {"user_id": user_ids, "item_id": item_ids, "timestamp": timestamps, "rating": ratings},
        copy=False,  # keep one block per column: no 2-D stacking copy
    )


def _ratings_table(src: _Source, release: Release) -> pa.Table:
    """The ratings file parsed and validated: columns user_id, item_id, rating (float64), timestamp (int64)."""
    label = src.describe(release.ratings)
    types = {"user_id": pa.int64(), "item_id": pa.int64(), "rating": pa.float64(), "timestamp": pa.int64()}
    if release.layout == "csv":
        names, sep, first_line = ("userId", "movieId", "rating", "timestamp"), ",", 2
        path = src.path(release.ratings)
        if path is not None:
            with open(path, "rb") as f:
                head = f.readline()
            source: Any = str(path)
        else:
            data = src.read_bytes(release.ratings)
            head = data[: data.find(b"\n") + 1 if b"\n" in data else len(data)]
            source = pa.BufferReader(data)
        header = _decode(head).strip().split(",")
        if header == [""]:
            raise MovieLensError(f"{label}: empty file")
        missing = [n for n in names if n not in header]
        if missing:
            raise MovieLensError(f"{label} line 1: missing column(s) {missing}; header is {','.join(header)!r}")
        read = pacsv.ReadOptions(block_size=_RATINGS_BLOCK_BYTES)
        parse = pacsv.ParseOptions(delimiter=",")
    else:
        names, first_line = ("user id", "item id", "rating", "timestamp"), 1
        sep = "\t" if release.layout == "100k" else "::"
        data = src.read_bytes(release.ratings)
        if not data.strip():
            raise MovieLensError(f"{label}: empty file")
        if release.layout == "dat":
            data = data.replace(b"::", b":")  # pyarrow wants a one-byte delimiter; ratings are numbers only
        source = pa.BufferReader(data)
        read = pacsv.ReadOptions(block_size=_RATINGS_BLOCK_BYTES, column_names=list(names))
        parse = pacsv.ParseOptions(delimiter="\t" if release.layout == "100k" else ":")
    rename = dict(zip(names, ("user_id", "item_id", "rating", "timestamp")))
    convert = pacsv.ConvertOptions(column_types={n: types[rename[n]] for n in names}, include_columns=list(names))
    display_names = names

    def locate() -> None:
        raw = src.read_bytes(release.ratings)
        _locate_bad_rating_line(label, _decode(raw), sep, display_names, first_line)

    try:
        table = pacsv.read_csv(source, read_options=read, parse_options=parse, convert_options=convert)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowKeyError) as e:
        locate()
        raise MovieLensError(f"{label}: cannot parse ({e})") from None
    if table.num_rows == 0:
        raise MovieLensError(f"{label}: empty file (no ratings)")
    if any(table.column(i).null_count for i in range(table.num_columns)) or not all(
        (np.isfinite(r) & (r >= RATING_MIN) & (r <= RATING_MAX)).all() for r in (c.to_numpy() for c in table.column("rating").chunks)
    ):
        locate()
        raise MovieLensError(f"{label}: empty, non-finite or out-of-range values")
    return table.select(list(names)).rename_columns(["user_id", "item_id", "rating", "timestamp"])


@dataclass
class _Movie:
    title: str
    genres: list[str]
    genres_raw: str


def _lines(label: str, data: bytes) -> Iterable[tuple[int, str]]:
    text = _decode(data)
    if not text.strip():
        raise MovieLensError(f"{label}: empty file")
    for line_no, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield line_no, line


def _read_movies(src: _Source, release: Release) -> dict[int, _Movie]:
    label = src.describe(release.movies)
    data = src.read_bytes(release.movies)
    movies: dict[int, _Movie] = {}

    def add(line_no: int, raw_id: str, title: str, genres: list[str], genres_raw: str) -> None:
        movie_id = _as_int(label, line_no, "movie id", raw_id.strip())
        if movie_id in movies:
            raise MovieLensError(f"{label} line {line_no}, field 'movie id': {movie_id} appears twice")
        movies[movie_id] = _Movie(title.strip(), genres, genres_raw)

    if release.layout == "100k":
        names = ("movie id", "title", "release date", "video release date", "IMDb URL", *ML100K_GENRES)
        for line_no, line in _lines(label, data):
            parts = line.split("|")
            _check_fields(label, line_no, parts, names, "|", line)
            flags = parts[5:]
            for genre, flag in zip(ML100K_GENRES, flags):
                if flag not in ("0", "1"):
                    raise MovieLensError(f"{label} line {line_no}, field {genre!r}: genre flag {flag!r} is not 0 or 1")
            genres = [g for g, f in zip(ML100K_GENRES, flags) if f == "1"]
            add(line_no, parts[0], parts[1], genres, "|".join(genres))
    elif release.layout == "dat":
        names = ("movie id", "title", "genres")
        for line_no, line in _lines(label, data):
            parts = line.split("::")
            _check_fields(label, line_no, parts, names, "::", line)
            add(line_no, parts[0], parts[1], _split_genres(parts[2]), parts[2].strip())
    else:
        rows = csv.reader(io.StringIO(_decode(data), newline=""))
        try:
            header = next(rows)
        except StopIteration:
            raise MovieLensError(f"{label}: empty file") from None
        missing = [c for c in ("movieId", "title", "genres") if c not in header]
        if missing:
            raise MovieLensError(f"{label} line 1: missing column(s) {missing}; header is {','.join(header)!r}")
        at = [header.index(c) for c in ("movieId", "title", "genres")]
        for row in rows:
            line_no = rows.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise MovieLensError(
                    f"{label} line {line_no}: expected {len(header)} fields ({','.join(header)}) separated by ',', "
                    f"got {len(row)} (a title with a comma must be quoted): {row!r}"
                )
            raw_id, title, genres = (row[i] for i in at)
            add(line_no, raw_id, title, _split_genres(genres), genres.strip())
    if not movies:
        raise MovieLensError(f"{label}: empty file (no movies)")
    return movies


def _split_genres(text: str) -> list[str]:
    genres = [g.strip() for g in text.split("|") if g.strip()]
    return [] if genres == [NO_GENRE] else genres


def _read_users(src: _Source, release: Release) -> pd.DataFrame | None:
    """Raw users: raw_id, gender, age (years or ml-1m's group code), occupation name / code."""
    if release.users is None:
        return None
    label = src.describe(release.users)
    rows = []
    if release.layout == "100k":
        names, sep = ("user id", "age", "gender", "occupation", "zip code"), "|"
    else:
        names, sep = ("user id", "gender", "age", "occupation", "zip-code"), "::"
    for line_no, line in _lines(label, src.read_bytes(release.users)):
        parts = line.split(sep)
        _check_fields(label, line_no, parts, names, sep, line)
        row = dict(zip(names, (p.strip() for p in parts)))
        raw_id = _as_int(label, line_no, "user id", row["user id"])
        age = _as_int(label, line_no, "age", row["age"])
        if row["gender"] not in GENDERS:
            raise MovieLensError(f"{label} line {line_no}, field 'gender': {row['gender']!r} is not F or M")
        occupation = row["occupation"]
        if release.layout != "100k":
            code = _as_int(label, line_no, "occupation", occupation)
            if not 0 <= code < len(ML1M_OCCUPATIONS):
                raise MovieLensError(f"{label} line {line_no}, field 'occupation': code {code} not in 0..20")
            occupation = ML1M_OCCUPATIONS[code]
        rows.append((raw_id, GENDERS[row["gender"]], age, occupation))
    return pd.DataFrame(rows, columns=["raw_id", "gender", "age", "occupation"])


def read_release(src: _Source, release: Release) -> tuple[pd.DataFrame, dict[int, _Movie], pd.DataFrame | None]:
    """(raw ratings, movies by raw id, raw users or None), validated."""
    return _read_ratings(src, release), _read_movies(src, release), _read_users(src, release)


# ---------------------------------------------------------------- ids and features


def _dense_map(raw: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Map raw ids to their index in ``present`` (sorted, containing every raw id)."""
    if len(present) and present[0] >= 0 and present[-1] < _RAW_ID_LOOKUP_LIMIT:
        lookup = np.full(int(present[-1]) + 1, -1, dtype=np.int64)
        lookup[present] = np.arange(len(present), dtype=np.int64)
        return lookup[raw]
    return np.searchsorted(present, raw).astype(np.int64)


def _distinct(ids: np.ndarray) -> np.ndarray:
    """Sorted distinct values (O(n) for small non-negative ints)."""
    if len(ids) and ids.min() >= 0 and ids.max() < _RAW_ID_LOOKUP_LIMIT:
        seen = np.zeros(int(ids.max()) + 1, dtype=bool)
        seen[ids] = True
        return np.flatnonzero(seen).astype(np.int64)
    return np.unique(ids)


def _year_buckets(years: np.ndarray) -> np.ndarray:
    buckets = 1 + np.searchsorted(np.asarray(YEAR_BUCKET_EDGES), years, side="right")
    return np.where(years > 0, buckets, 0).astype(np.int64)


def _items_tables(raw_item_ids: np.ndarray, movies: dict[int, _Movie], ratings_label: str, movies_label: str):
    missing = [int(i) for i in raw_item_ids if int(i) not in movies]
    if missing:
        raise MovieLensError(
            f"{ratings_label}: movie id(s) {missing[:5]} ({len(missing)} in all) have no row in {movies_label}"
        )
    kept = [movies[int(i)] for i in raw_item_ids]
    names = sorted({g for m in kept for g in m.genres} | ({NO_GENRE} if any(not m.genres for m in kept) else set()))
    index = {g: c for c, g in enumerate(names)}
    categories = [sorted(index[g] for g in set(m.genres)) or [index[NO_GENRE]] for m in kept]
    years = np.array([int(y.group(1)) if (y := _YEAR.search(m.title)) else 0 for m in kept], dtype=np.int64)
    n = len(kept)
    items = pd.DataFrame(
        {
            "item_id": np.arange(n, dtype=np.int64),
            "categories": categories,
            "title": [m.title for m in kept],
            "year": years,
            "year_bucket": _year_buckets(years),
        }
    )
    vocab = pd.DataFrame(
        {
            "raw_id": raw_item_ids.astype(np.int64),
            "item_id": np.arange(n, dtype=np.int64),
            "title": [m.title for m in kept],
            "genres": [m.genres_raw for m in kept],
        }
    )
    category_vocab = pd.DataFrame({"category_id": np.arange(len(names), dtype=np.int64), "name": names})
    return items, vocab, category_vocab


def _users_tables(raw_user_ids: np.ndarray, users: pd.DataFrame | None, ratings_label: str, users_label: str | None,
                  layout: str):
    n = len(raw_user_ids)
    vocab = pd.DataFrame({"raw_id": raw_user_ids.astype(np.int64), "user_id": np.arange(n, dtype=np.int64)})
    table = pd.DataFrame({"user_id": np.arange(n, dtype=np.int64)})
    if users is None:
        return table, vocab, None, {}
    dup = users["raw_id"].duplicated()
    if dup.any():
        raise MovieLensError(f"{users_label}: user id {int(users['raw_id'][dup].iloc[0])} appears twice")
    by_raw = users.set_index("raw_id")
    missing = np.setdiff1d(raw_user_ids, by_raw.index.to_numpy())
    if len(missing):
        raise MovieLensError(f"{ratings_label}: user id(s) {missing[:5].tolist()} have no row in {users_label}")
    rows = by_raw.loc[raw_user_ids]
    # ml-1m: its 21 codes in order; ml-100k: the names it uses, sorted
    occupations = list(ML1M_OCCUPATIONS) if layout == "dat" else sorted(set(users["occupation"]))
    occupation_index = {name: i for i, name in enumerate(occupations)}
    table["gender"] = rows["gender"].to_numpy(np.int64)
    table["age_bucket"] = np.searchsorted(np.asarray(AGE_BUCKET_EDGES), rows["age"].to_numpy(), side="right").astype(np.int64)
    table["occupation"] = np.array([occupation_index[o] for o in rows["occupation"]], dtype=np.int64)
    occupation_vocab = pd.DataFrame({"occupation": np.arange(len(occupations), dtype=np.int64), "name": occupations})
    sizes = {"gender": len(GENDERS), "age_bucket": len(AGE_BUCKET_EDGES) + 1, "occupation": len(occupations)}
    return table, vocab, occupation_vocab, sizes


# ---------------------------------------------------------------- prepare


def cache_key(release: str, sources: list[dict[str, str]], protocol: str, seed: int, options: dict[str, Any]) -> str:
    """16 hex of sha256 over (release, source sha256s, protocol, seed, filter/protocol options, versions)."""
    payload = {
        "release": release,
        "sources": sorted(s["sha256"] for s in sources),
        "protocol": protocol,
        "seed": seed,
        "options": options,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def prepare_movielens(
    release: str,
    *,
    root: str | os.PathLike,
    name: str | None = None,
    protocol: str = "recbole",
    seed: int = 0,
    min_rating: float = 0.0,
    min_user_interactions: int = 0,
    min_item_interactions: int = 0,
    num_heldout_users: int = 0,
    url: str = "",
    md5: str = "",
    allow_download: bool = True,
    progress: bool = True,
) -> Path:
    """Prepare ``<root>/<release>-<protocol>-<cache_key>`` and return its absolute path.

    Idempotent: a complete dir whose meta.json carries the same key is returned untouched
    (the key covers the source files' sha256, the protocol, the seed and every option).
    ``min_rating`` keeps ratings >= it (stars; 0 keeps all); ``min_*_interactions`` is the
    k-core (0 disables); ``num_heldout_users`` is for strong_generalization (0 = proportional).
    """
    if release not in RELEASES:
        raise MovieLensError(f"unknown MovieLens release {release!r}; known: {', '.join(RELEASES)}")
    if protocol not in PROTOCOLS:
        raise MovieLensError(f"unknown split protocol {protocol!r}; known: {sorted(PROTOCOLS)}")
    rel = RELEASES[release]
    root = Path(root).absolute()
    src = locate_source(rel, root, url=url, md5=md5, allow_download=allow_download, progress=progress)
    options = {
        "min_rating": float(min_rating),
        "min_user_interactions": int(min_user_interactions),
        "min_item_interactions": int(min_item_interactions),
    }
    protocol_options: dict[str, Any] = {}
    if protocol == "strong_generalization":
        protocol_options = {"num_heldout_users": int(num_heldout_users), "drop_unseen_items": True}

    def key_and_dir(sources: list[dict[str, str]]) -> tuple[str, Path]:
        key = cache_key(rel.name, sources, protocol, seed, {**options, **protocol_options})
        return key, root / f"{rel.name}-{protocol}-{key}"

    # The key needs the sources' sha256 (~0.5 s for ml-25m). Only a complete dir of this release and
    # protocol can be a cache hit: without one, hash on a second thread once the CSV reader (which
    # uses every core) is done.
    pending_sources: Future | None = None
    if any(is_complete(d) for d in root.glob(f"{rel.name}-{protocol}-*")):
        sources = src.checksums()
        key, out_dir = key_and_dir(sources)
        if is_prepared(out_dir, key):
            return out_dir
        pending_sources = Future()
        pending_sources.set_result(sources)

    table = _ratings_table(src, rel)
    num_raw = table.num_rows
    # Second thread, beside the numpy work: the movies and users files (read and checked here, before
    # anything can fail on the ratings, so errors come in file order), then the hash if still needed.
    pool = ThreadPoolExecutor(max_workers=1)
    pending_features = pool.submit(lambda: (_read_movies(src, rel), _read_users(src, rel)))
    if pending_sources is None:
        pending_sources = pool.submit(src.checksums)
    pool.shutdown(wait=False)  # its thread ends with the last job
    # Hand the CSV reader's scratch memory back to the OS now: the numpy arrays that follow then reuse
    # those pages, which on a VM is several times faster than touching fresh ones.
    pa.default_memory_pool().release_unused()
    batches = table.to_batches()
    del table  # the batches hold the only references: _ratings_frame frees them one by one
    ratings = _ratings_frame(batches, min_rating=options["min_rating"])  # the rating filter, applied early
    ratings_label = src.describe(rel.ratings)
    kept = filter_interactions(ratings, **options)
    del ratings
    movies, users = pending_features.result()
    if len(kept) == 0:
        raise MovieLensError(f"{ratings_label}: no ratings left after the filters {options} (of {num_raw})")

    # contiguous ids before the split: small ids make its sorts one-pass (splits.lexsort_fast)
    raw_users, raw_items = _distinct(kept["user_id"].to_numpy()), _distinct(kept["item_id"].to_numpy())
    kept["user_id"] = _dense_map(kept["user_id"].to_numpy(), raw_users)
    kept["item_id"] = _dense_map(kept["item_id"].to_numpy(), raw_items)
    heldout = None
    if protocol == "strong_generalization":
        from data_pipelines.splits import strong_generalization_users

        valid_users, test_users = strong_generalization_users(kept, seed=seed, num_heldout_users=num_heldout_users)
        heldout = (valid_users, test_users)
    try:
        parts = list(split(kept, protocol, seed=seed, **protocol_options))
    except ValueError as e:
        raise MovieLensError(f"{rel.name}, protocol {protocol}: {e}") from None
    num_kept = len(kept)
    del kept
    for split_name, part in zip(("train", "valid", "test"), parts):
        if len(part) == 0:
            raise MovieLensError(
                f"{rel.name}: protocol {protocol} (seed {seed}, filters {options}) leaves the {split_name} split "
                f"empty ({[len(p) for p in parts]} train/valid/test rows); nothing was written"
            )

    # the protocol may drop users or items (strong_generalization drops rows): compact the ids again
    if sum(len(p) for p in parts) < num_kept:
        used_users = _distinct(np.concatenate([p["user_id"].to_numpy() for p in parts]))
        used_items = _distinct(np.concatenate([p["item_id"].to_numpy() for p in parts]))
    else:  # every kept row is in a split, so every user and item is too
        used_users, used_items = np.arange(len(raw_users)), np.arange(len(raw_items))
    if len(used_users) < len(raw_users) or len(used_items) < len(raw_items):
        for p in parts:
            p["user_id"] = _dense_map(p["user_id"].to_numpy(), used_users)
            p["item_id"] = _dense_map(p["item_id"].to_numpy(), used_items)
        if heldout is not None:
            heldout = tuple(_dense_map(h[np.isin(h, used_users)], used_users) for h in heldout)
        raw_users, raw_items = raw_users[used_users], raw_items[used_items]

    items, item_vocab, category_vocab = _items_tables(raw_items, movies, ratings_label, src.describe(rel.movies))
    users_table, user_vocab, occupation_vocab, user_feature_sizes = _users_tables(
        raw_users, users, ratings_label, src.describe(rel.users) if rel.users else None, rel.layout
    )
    extra = {"vocab/users.parquet": user_vocab, "vocab/items.parquet": item_vocab, "vocab/categories.parquet": category_vocab}
    if occupation_vocab is not None:
        extra["vocab/occupations.parquet"] = occupation_vocab
    sources = pending_sources.result()
    key, out_dir = key_and_dir(sources)
    meta: dict[str, Any] = {
        "name": name or f"movielens_{rel.name.removeprefix('ml-').replace('-', '_')}",
        "release": rel.name,
        "protocol": protocol,
        "seed": seed,
        "filters": options,
        "protocol_options": protocol_options,
        "num_users": len(raw_users),
        "num_items": len(raw_items),
        "num_categories": len(category_vocab),
        "num_raw_ratings": num_raw,
        "num_year_buckets": len(YEAR_BUCKET_EDGES) + 2,
        "year_bucket_edges": list(YEAR_BUCKET_EDGES),
        "user_features": user_feature_sizes,
        "sources": sources,
        "code_version": CODE_VERSION,
        "pipeline_version": PIPELINE_VERSION,
        "cache_key": key,
    }
    if heldout is not None:
        valid_users, test_users = heldout
        extra["heldout_users.parquet"] = pd.DataFrame(
            {
                "user_id": np.concatenate([valid_users, test_users]).astype(np.int64),
                "split": ["valid"] * len(valid_users) + ["test"] * len(test_users),
            }
        )
        meta["strong_generalization"] = {
            "num_valid_users": len(valid_users),
            "num_test_users": len(test_users),
            "fold_in": "train.parquet rows of the users in heldout_users.parquet (80%); targets in valid/test (20%)",
            "recall": "hits / min(K, |relevant|)",
            "ndcg_k": 100,
        }
    train, valid, test = parts
    return write_dataset_dir(out_dir, train=train, valid=valid, test=test, items=items, users=users_table,
                             meta=meta, extra_tables=extra)
