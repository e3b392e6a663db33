"""The source files a configuration names, checked to exist, and their sha256s (the cache key's)."""

from __future__ import annotations

from pathlib import Path

from data_pipelines.config import InteractionsDataConfig
from data_pipelines.download import file_digests
from data_pipelines.errors import DatasetError


def source_paths(cfg: InteractionsDataConfig, protocol: str) -> dict[str, Path]:
    """Role (log | train / valid / test, items, users) -> path, for the roles configured."""
    named = _given_paths(cfg) if protocol == "given" else _log_path(cfg, protocol)
    named.update(items=cfg.items_path, users=cfg.users_path)
    paths = {k: Path(v) for k, v in named.items() if v}
    for key, p in paths.items():
        if not p.exists():
            setting = "path" if key == "log" else f"{key}_path"
            raise DatasetError(f"{p}: no such file or folder (data.interactions.{setting})")
    return paths


def _given_paths(cfg: InteractionsDataConfig) -> dict[str, str]:
    if cfg.path:
        raise DatasetError(
            "data.protocol=given reads data.interactions.train_path / valid_path / test_path; "
            f"data.interactions.path={cfg.path!r} is for the other protocols"
        )
    if not cfg.train_path or not cfg.test_path:
        raise DatasetError(
            "data.protocol=given needs data.interactions.train_path and test_path (valid_path is optional)"
        )
    return {"train": cfg.train_path, "valid": cfg.valid_path, "test": cfg.test_path}


def _log_path(cfg: InteractionsDataConfig, protocol: str) -> dict[str, str]:
    if not cfg.path:
        raise DatasetError(
            f"data.interactions.path is not set (the log to split by protocol {protocol!r}); "
            "for a split of your own use data.protocol=given with train_path / test_path"
        )
    return {"log": cfg.path}


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]


def hash_sources(paths: dict[str, Path], expected_md5: dict[str, str]) -> list[dict[str, str]]:
    """Each source file's role, path and sha256 (the cache key), the files named in ``expected_md5``
    checked against it on the same read."""
    by_name = {f.name for p in paths.values() for f in _files(p)}
    unknown = sorted(set(expected_md5) - by_name)
    if unknown:
        raise DatasetError(
            f"data.interactions.md5 names {unknown[0]!r}, which is none of the source files {sorted(by_name)}"
        )
    sources = []
    for role, p in paths.items():
        for f in _files(p):
            want = expected_md5.get(f.name)
            digests = file_digests(f, ("md5", "sha256") if want else ("sha256",))
            if want and digests["md5"] != want.lower():
                raise DatasetError(
                    f"{f}: md5 {digests['md5']}, expected {want} (data.interactions.md5): "
                    "the file is damaged or another version; nothing was written"
                )
            sources.append({"role": role, "file": str(f), "sha256": digests["sha256"]})
    return sources
