"""The download path against a local http.server in a thread: complete, corrupt, checksum
mismatch, interrupted. Nothing reaches the network; a failed download leaves no file behind."""

from __future__ import annotations

import http.server
import threading

import pytest

from data_pipelines.dataset_dir import read_meta
from data_pipelines.movielens import MovieLensError, prepare_movielens
from tests.helpers.movielens import md5_of, zip_bytes

ZIP = zip_bytes("ml-100k")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        body = {"/ml-100k.zip": ZIP, "/corrupt.zip": b"PK\x03\x04 not really a zip" * 100}.get(self.path)
        if self.path == "/interrupted.zip":  # announces the whole zip, sends half, closes
            self.send_response(200)
            self.send_header("Content-Length", str(len(ZIP)))
            self.end_headers()
            self.wfile.write(ZIP[: len(ZIP) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _prepare(root, url, md5):
    return prepare_movielens("ml-100k", root=root, url=url, md5=md5, min_rating=3.0, progress=False)


def test_complete_download_is_verified_renamed_and_recorded(tmp_path, server):
    path = _prepare(tmp_path, f"{server}/ml-100k.zip", md5_of(ZIP))
    assert (tmp_path / "ml-100k.zip").read_bytes() == ZIP
    meta = read_meta(path)
    assert meta["counts"] == {"train": 32, "valid": 6, "test": 6}
    assert meta["sources"][0]["file"] == "ml-100k.zip" and meta["sources"][0]["from"].startswith(f"download {server}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ml-100k.zip", path.name])
    assert _prepare(tmp_path, "http://127.0.0.1:9/unused.zip", "skip") == path  # local zip now: no download


@pytest.mark.parametrize(
    "name, md5, pattern",
    [
        ("ml-100k.zip", "0" * 32, r"checksum mismatch for .*ml-100k\.zip: md5 [0-9a-f]{32}, expected 0{32}"),
        ("corrupt.zip", "skip", r"is not the ml-100k zip: .*not a readable zip"),
        ("interrupted.zip", "skip", r"interrupted"),
        ("missing.zip", "skip", r"cannot download .*missing\.zip: .*Not Found"),
    ],
)
def test_failed_download_keeps_nothing_and_says_where_to_put_the_file(tmp_path, server, name, md5, pattern):
    with pytest.raises(MovieLensError, match=pattern) as info:
        _prepare(tmp_path, f"{server}/{name}", md5)
    assert "put ml-100k.zip (from https://files.grouplens.org/datasets/movielens/ml-100k.zip)" in str(info.value)
    assert list(tmp_path.iterdir()) == []  # no zip, no .part file, no dataset dir


def test_published_md5_is_checked_by_default(tmp_path, server):
    with pytest.raises(MovieLensError, match=r"expected 0e33842e24a9c977be4e0107933c0723"):
        _prepare(tmp_path, f"{server}/ml-100k.zip", "")
