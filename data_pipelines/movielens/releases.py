"""The MovieLens releases (``RELEASES``), their error type, and where a release's files are found or fetched."""

from __future__ import annotations

import os
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from data_pipelines.download import DownloadError, download, sha256_file
from data_pipelines.errors import DatasetError

BASE_URL = "https://files.grouplens.org/datasets/movielens"
PIPELINE_VERSION = "movielens/1"  # bump when this module's output for the same input changes
NO_GENRE = "(no genres listed)"  # ml-20m's own name for a movie without genres; used for every release
YEAR_BUCKET_EDGES = tuple(range(1920, 2030, 10))  # decade starts; bucket 1 is before 1920, 12 from 2020
AGE_BUCKET_EDGES = (18, 25, 35, 45, 50, 56)  # ml-1m's age groups; ml-100k's ages are cut the same way
GENDERS = {"F": 0, "M": 1}
ML100K_GENRES = (  # u.genre, in the order of u.item's 19 flags
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
ML1M_OCCUPATIONS = (  # ml-1m README: users.dat occupation codes 0..20
    "other or not specified",
    "academic/educator",
    "artist",
    "clerical/admin",
    "college/grad student",
    "customer service",
    "doctor/health care",
    "executive/managerial",
    "farmer",
    "homemaker",
    "K-12 student",
    "lawyer",
    "programmer",
    "retired",
    "sales/marketing",
    "scientist",
    "self-employed",
    "technician/engineer",
    "tradesman/craftsman",
    "unemployed",
    "writer",
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
        Release(
            "ml-1m", ("ml-1m",), "dat", "ratings.dat", "movies.dat", "users.dat", "c4d9eecfca2ab87c1945afe126590906"
        ),
        Release(
            "ml-10m",
            ("ml-10M100K", "ml-10m"),
            "dat",
            "ratings.dat",
            "movies.dat",
            None,
            "ce571fd55effeba0271552578f2648bd",
        ),
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
            raise MovieLensError(
                f"{self.describe(file)}: corrupt zip member ({e}); delete {self.zip_path} and run again"
            ) from None

    def checksums(self) -> list[dict[str, str]]:
        return [{"file": self.zip_path.name, "sha256": sha256_file(self.zip_path), "from": self.how}]


def _release_files(release: Release) -> tuple[str, ...]:
    return tuple(f for f in (release.ratings, release.movies, release.users) if f)


def locate_source(
    release: Release,
    root: str | os.PathLike,
    *,
    url: str = "",
    md5: str = "",
    allow_download: bool = True,
    progress: bool = True,
) -> _Source:
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
        raise MovieLensError(
            f"{release.name}: no local copy and downloads are off (data.movielens.download=false): {where}"
        )
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
    return _ZipSource(
        zip_path, release, files, f"download {url or official}" + (f" md5 {expected}" if expected else "")
    )


# ---------------------------------------------------------------- parsing
