"""docs/configuration.md is generated from the config dataclasses (scripts/config_reference.py): it must be
fresh, and every field of every entry point's schema must say what it means (its comment)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "config_reference.py"


def _script():
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_config_field_has_a_description():
    missing = _script().undocumented_fields()
    assert not missing, f"config fields without a comment (the reference's meaning column): {missing}"


def test_configuration_reference_is_fresh():
    script = _script()
    assert script.PAGE.read_text() == script.render(), (
        "docs/configuration.md is stale: run `python scripts/config_reference.py` (or `make docs`) and commit it"
    )


def test_a_field_without_a_comment_is_found(tmp_path, monkeypatch):
    """The check itself: a dataclass field with no comment above or beside it is reported, one with either is not."""
    import sys

    source = tmp_path / "schema_probe.py"
    source.write_text(
        "from dataclasses import dataclass\n\n\n@dataclass\nclass Probe:\n"
        "    # above\n    a: int = 1\n    b: int = 2  # beside\n    c: int = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import schema_probe

    try:
        assert _script().field_comments(schema_probe.Probe) == {"a": "above", "b": "beside", "c": ""}
    finally:
        sys.modules.pop("schema_probe", None)
