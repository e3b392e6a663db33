"""MkDocs hooks (mkdocs.yml `hooks:`), so that the site is built from the files people read on GitHub:

- before every build, docs/configuration.md is regenerated from the config dataclasses
  (scripts/config_reference.py; rewritten only when its text changes, so `mkdocs serve` does not loop);
- the site's home page is the README, its links into docs/ made relative to the site.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_pre_build(config, **kwargs) -> None:
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([])


def on_files(files, config, **kwargs):
    readme = (ROOT / "README.md").read_text()
    files.append(File.generated(config, "index.md", content=re.sub(r"\]\(docs/", "](", readme)))
    return files
