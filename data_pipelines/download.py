"""Verified downloads: a temporary file, a progress bar, a checksum, then one rename.

    >>> download("https://files.grouplens.org/datasets/movielens/ml-1m.zip", Path("data/ml-1m.zip"),
    ...          md5="c4d9eecfca2ab87c1945afe126590906")

The bytes go to ``<dest dir>/.<dest name>.part-<pid>-<random>`` while their md5 and sha256 are
computed; ``dest`` appears (``os.replace``) only when every byte announced by Content-Length
arrived, the md5 matches the expected one (when given) and ``validate`` (e.g. "is a zip")
accepts the file. Any failure removes the temporary file and raises ``DownloadError``; an
existing ``dest`` is never touched before the rename.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from data_pipelines.atomic import staged

__all__ = ["DownloadError", "Downloaded", "download", "file_digests", "sha256_file"]

CHUNK_BYTES = 1 << 20  # read / hash granularity
TIMEOUT_S = 60.0  # socket timeout per read, seconds


class DownloadError(OSError):
    """A download that failed, was cut short or did not verify; the message says what to do."""


@dataclass(frozen=True)
class Downloaded:
    path: Path
    num_bytes: int
    md5: str
    sha256: str


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (~1.3 GB/s with SHA-NI)."""
    return file_digests(path, ("sha256",))["sha256"]


def file_digests(path: str | os.PathLike, names: tuple[str, ...] = ("md5", "sha256")) -> dict[str, str]:
    """Hex digests of a file by hashlib name, all from one read of it."""
    hashes = {name: hashlib.new(name) for name in names}
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES * 16):
            for h in hashes.values():
                h.update(chunk)
    return {name: h.hexdigest() for name, h in hashes.items()}


def download(
    url: str,
    dest: str | os.PathLike,
    *,
    md5: str | None = None,
    validate: Callable[[Path], None] | None = None,
    progress: bool = True,
    timeout_s: float = TIMEOUT_S,
) -> Downloaded:
    """Fetch ``url`` into ``dest`` atomically and verified (see the module docstring).

    ``md5``: expected hex digest (GroupLens publishes one per release); None skips the check
    (the sha256 is returned either way, for the record). ``validate(tmp_path)`` may raise to
    reject the content; its message is kept.
    """
    dest = Path(dest)
    with staged(dest, "part", hidden=True) as tmp:
        response = _open(url, timeout_s)
        with response, open(tmp, "wb") as out:
            got = _copy(response, out, url, desc=f"download {dest.name}", progress=progress)
        _check(url, got, md5)
        if validate is not None:
            validate(tmp)
    return Downloaded(dest, got.num_bytes, got.md5, got.sha256)


def _open(url: str, timeout_s: float):
    try:
        return urllib.request.urlopen(url, timeout=timeout_s)
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise DownloadError(f"cannot download {url}: {reason}") from None


@dataclass(frozen=True)
class _Received:
    num_bytes: int
    expected: int | None  # the Content-Length, when the server sent one
    md5: str
    sha256: str


def _copy(response, out, url: str, *, desc: str, progress: bool) -> _Received:
    """The response's body into ``out``, hashed on the way."""
    h_md5, h_sha = hashlib.md5(), hashlib.sha256()
    received = 0
    length = response.headers.get("Content-Length")
    expected = int(length) if length and length.isdigit() else None
    bar_options = dict(unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not progress, leave=False)
    with tqdm(total=expected, **bar_options) as bar:
        while True:
            try:
                chunk = response.read(CHUNK_BYTES)
            except (http.client.IncompleteRead, http.client.HTTPException, OSError) as e:
                raise DownloadError(
                    f"download of {url} interrupted after {received} of {expected or '?'} bytes ({e!r}); "
                    "nothing was kept, run again"
                ) from None
            if not chunk:
                break
            out.write(chunk)
            h_md5.update(chunk)
            h_sha.update(chunk)
            received += len(chunk)
            bar.update(len(chunk))
    return _Received(received, expected, h_md5.hexdigest(), h_sha.hexdigest())


def _check(url: str, got: _Received, md5: str | None) -> None:
    """Every byte the server announced, at least one, and the expected md5."""
    if got.expected is not None and got.num_bytes != got.expected:
        raise DownloadError(
            f"download of {url} interrupted: got {got.num_bytes} of {got.expected} bytes; nothing was kept, run again"
        )
    if got.num_bytes == 0:
        raise DownloadError(f"download of {url} is empty (0 bytes)")
    if md5 is not None and got.md5 != md5.lower():
        raise DownloadError(
            f"checksum mismatch for {url}: md5 {got.md5}, expected {md5.lower()}; the file was not kept "
            "(a proxy or a changed upstream file?)"
        )
