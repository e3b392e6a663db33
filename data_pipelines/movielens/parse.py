"""Parse a release's ratings, movies and users files, each in its own format, with errors naming file, line and field."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from data_pipelines.movielens.releases import (
    _RATINGS_BLOCK_BYTES,
    _RELEASE_EVERY_BATCHES,
    GENDERS,
    ML1M_OCCUPATIONS,
    ML100K_GENRES,
    NO_GENRE,
    MovieLensError,
    Release,
    _Source,
)


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
        raise MovieLensError(
            f"{label} line {line_no}, field {field!r}: {value!r} is outside [{RATING_MIN}, {RATING_MAX}]"
        )
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
        (np.isfinite(r) & (r >= RATING_MIN) & (r <= RATING_MAX)).all()
        for r in (c.to_numpy() for c in table.column("rating").chunks)
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
