"""docs/configuration.md, generated from the config dataclasses so that the reference cannot drift.

    $ python scripts/config_reference.py            # rewrite docs/configuration.md
    $ python scripts/config_reference.py --check    # exit 1 when docs/configuration.md is stale

Every key of every entry point's schema (recsys/config/, data_pipelines/config.py): its type, the
default the entry point composes from conf/ (its config groups' defaults applied), and its meaning, which
is the field's comment: the comment lines right above it plus those on its own line(s). `make docs`
regenerates the page before building the site (scripts/mkdocs_hooks.py); tests/config/test_config_reference.py
fails when the page is stale or when a field has no comment.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import sys
import tokenize
import typing
from collections.abc import Iterator
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recsys.components.losses import PACKAGE as LOSSES
from recsys.components.query_encoders import PACKAGE as QUERY_ENCODERS
from recsys.components.registry import component_configs
from recsys.config import Config, EvaluateConfig, ExportConfig, PlanConfig, register_configs

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
CONF = ROOT / "conf"

# the training config's top-level keys, each with the config groups that set it (conf/<group>/*.yaml)
GROUPS = {
    "data": ["data", "data/protocol"],
    "model": ["model", "model/loss", "model/query_encoder", "model/side"],
    "optim": ["optim/sparse", "optim/dense"],
    "sharding": ["sharding"],
    "trainer": ["trainer"],
    "eval": ["eval"],
}
# the other entry points: (heading, schema, root config in conf/, keys documented with the training config)
ENTRY_POINTS = (
    ("`recsys.evaluate` (`run_dir=...`)", EvaluateConfig, "evaluate", ()),
    ("`recsys.export` (`run_dir=...`)", ExportConfig, "export", ()),
    ("`python scripts/plan_sharding.py`", PlanConfig, "plan", ("model", "sharding", "optim")),
)


# ---------------------------------------------------------------- a field's comment


@cache
def _source(path: Path) -> tuple[ast.Module, dict[int, str], list[str]]:
    """The module's syntax tree, its comments by line number, and its lines."""
    text = path.read_text()
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT and not tok.string.lstrip("# ").startswith("noqa")
    }
    return ast.parse(text), comments, text.splitlines()


def field_comments(cls: type) -> dict[str, str]:
    """Each field of the dataclass ``cls`` -> its comment ("" when it has none): the comment lines right
    above the field (no blank line between) followed by the comments on the lines the field spans; a field it
    inherits, as the dataclass that declares it says (recsys's DataConfig extends the pipelines')."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(_own_field_comments(base))
    return out


def _own_field_comments(cls: type) -> dict[str, str]:
    path = Path(sys.modules[cls.__module__].__file__)
    tree, comments, lines = _source(path)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    out = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above, line = [], stmt.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments.get(line, ""))
            line -= 1
        within = [comments[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in comments]
        out[stmt.target.id] = " ".join(c for c in above + within if c)
    return out


def documented_classes() -> list[type]:
    """Every dataclass the entry points' schemas reach (the ones whose fields the page lists)."""
    seen: list[type] = []

    def visit(cls: type) -> None:
        if cls in seen:
            return
        seen.append(cls)
        for f in dataclasses.fields(cls):
            for inner in _dataclasses_in(_hints(cls)[f.name]):
                visit(inner)

    components = [c for package in COMPONENTS.values() for c in component_configs(package).values()]
    for cls in (Config, EvaluateConfig, ExportConfig, PlanConfig, *ranker_settings().values(), *components):
        visit(cls)
    return seen


# sections that hold a component chosen by name (recsys/components/registry.py): each component's settings below them
COMPONENTS = {f"model.{key}": package for key, package in (("loss", LOSSES), ("query_encoder", QUERY_ENCODERS))}
RANKER_SETTINGS = "eval.settings"  # a dict whose entries each ranker's package types (recsys/rankers/registry.py)


def ranker_settings() -> dict[str, type]:
    """Each registered ranker's (and combinator's) settings dataclass by name."""
    from recsys.rankers.registry import COMBINATORS, ranker_specs

    return {
        name: spec.settings for name, spec in {**ranker_specs(), **COMBINATORS}.items() if spec.settings is not None
    }


def undocumented_fields() -> list[str]:
    """``Class.field`` of every schema field without a comment (tests/config/test_config_reference.py wants none)."""
    return [
        f"{cls.__module__}.{cls.__name__}.{name}"
        for cls in documented_classes()
        for name, comment in field_comments(cls).items()
        if not comment
    ]


# ---------------------------------------------------------------- types and values


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # each field's names resolved in the module of the class that declares it


def _dataclasses_in(hint: Any) -> list[type]:
    """The dataclasses a field's type holds: the type itself, or a dict's values."""
    if dataclasses.is_dataclass(hint):
        return [hint]
    if typing.get_origin(hint) in (dict, list):
        return [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
    return []


def _type_name(hint: Any) -> str:
    if isinstance(hint, type) and issubclass(hint, Enum):
        return " \\| ".join(m.value for m in hint)
    if isinstance(hint, type):
        return hint.__name__
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " \\| ".join("None" if a is type(None) else _type_name(a) for a in args)
    return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"


def _value(v: Any) -> str:
    """A config value as one would write it in YAML flow style."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Enum):
        return str(v.value)
    if isinstance(v, str):
        return v if v else '""'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def _without_defaults(entries: dict, cls: type) -> dict:
    """Dict-of-dataclass entries with only the fields that differ from the dataclass defaults."""
    defaults = _plain(cls())
    return {name: {k: v for k, v in entry.items() if defaults.get(k) != v} for name, entry in entries.items()}


def _plain(obj: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(obj), resolve=False, enum_to_str=True)


def _cell(text: str) -> str:
    """Text in a Markdown table cell: pipes escaped, no HTML tags, no emphasis."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _code(value: str) -> str:
    return "`" + value.replace("|", "\\|") + "`" if value else ""


# ---------------------------------------------------------------- the page


def compose(config_name: str) -> DictConfig:
    """conf/<config_name>.yaml with its default groups, as the entry point composes it with no overrides."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name=config_name)


def _table(cls: type, prefix: str, composed: Any) -> Iterator[str]:
    """One row per field of ``cls`` that is not itself a dataclass (those get a section of their own)."""
    hints, comments = _hints(cls), field_comments(cls)
    yield "| key | type | default | meaning |"
    yield "|---|---|---|---|"
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            continue
        value = composed.get(f.name) if isinstance(composed, dict) else None
        inner = _dataclasses_in(hint)
        if inner and isinstance(value, dict):
            value = _without_defaults(value, inner[0])
        if f"{prefix}{f.name}" == RANKER_SETTINGS:
            value = "{" + ", ".join(f"{name}: ..." for name in value or {}) + "}"  # each: a section below
        type_name = _type_name(hint)
        if f"{prefix}{f.name}" in COMPONENTS:  # its settings: a section per component below
            names = component_configs(COMPONENTS[f"{prefix}{f.name}"])
            type_name, value = " \\| ".join(names), "{name: " + str((value or {}).get("name")) + ", ...}"
        key = f"`{prefix}{f.name}`"
        yield f"| {key} | {type_name} | {_code(_value(value))} | {_cell(comments[f.name])} |"


def _sections(cls: type, prefix: str, composed: Any, level: int, skip: tuple[str, ...] = ()) -> Iterator[str]:
    """The table of ``cls``'s plain fields, then a section per dataclass field and per dict-of-dataclass field."""
    yield from _table(cls, prefix, composed)
    hints, comments = _hints(cls), field_comments(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint = hints[f.name]
        sub = composed.get(f.name) if isinstance(composed, dict) else None
        if dataclasses.is_dataclass(hint):
            yield ""
            yield f"{'#' * level} `{prefix}{f.name}`"
            yield ""
            yield _cell(comments[f.name])
            yield ""
            yield from _sections(hint, f"{prefix}{f.name}.", sub, level + 1)
        elif f"{prefix}{f.name}" in COMPONENTS:
            for name, settings in component_configs(COMPONENTS[f"{prefix}{f.name}"]).items():
                doc = " ".join((sys.modules[settings.__module__].__doc__ or "").split())
                yield ""
                yield f"{'#' * level} `{prefix}{f.name}` with `name: {name}`"
                yield ""
                yield _cell(doc.split(". ")[0].rstrip(".") + ".")
                yield ""
                given = sub if isinstance(sub, dict) and sub.get("name") == name else _plain(settings())
                yield from _sections(settings, f"{prefix}{f.name}.", given, level + 1)
        elif f"{prefix}{f.name}" == RANKER_SETTINGS:
            for name, settings in ranker_settings().items():
                yield ""
                yield f"{'#' * level} `{RANKER_SETTINGS}.{name}`"
                yield ""
                yield _cell(" ".join((settings.__doc__ or "").split()))
                yield ""
                given = sub.get(name) if isinstance(sub, dict) else None
                yield from _sections(settings, f"{RANKER_SETTINGS}.{name}.", given, level + 1)
        elif inner := _dataclasses_in(hint):
            entry = "[i]" if typing.get_origin(hint) is list else ".<name>"
            yield ""
            yield f"{'#' * level} `{prefix}{f.name}{entry}`"
            yield ""
            yield (
                f"Each entry of `{prefix}{f.name}` ({_cell(comments[f.name])}); the defaults are what an entry "
                "added on the command line or in a file gets."
            )
            yield ""
            yield from _sections(inner[0], f"{prefix}{f.name}{entry}.", _plain(inner[0]()), level + 1)


def _option_summary(path: Path) -> str:
    """The first sentence of a group option's leading comment ("" when it has none)."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if text.startswith("@package"):
            continue
        if text.startswith(("python ", "$ ")) or line.startswith("#   "):  # a command line: the sentence ended
            break
        words.append(text)
        if text.endswith((".", ":")):
            break
    summary = " ".join(words).rstrip(":").strip()
    return summary


def _groups(keys: list[str], defaults: dict[str, str]) -> Iterator[str]:
    yield "| group | option | what it is |"
    yield "|---|---|---|"
    for group in keys:
        for path in sorted((CONF / group).glob("*.yaml")):
            default = " (default)" if defaults.get(group) == path.stem else ""
            yield f"| `{group}` | `{path.stem}`{default} | {_cell(_option_summary(path))} |"


def _root_defaults() -> dict[str, str]:
    """conf/config.yaml's defaults list: group -> default option."""
    out = {}
    for entry in OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))["defaults"]:
        if isinstance(entry, dict):
            out.update(entry)
    return out


def render() -> str:
    """The page's Markdown."""
    training = OmegaConf.to_container(compose("config"), resolve=False, enum_to_str=True)
    defaults = _root_defaults()
    hints, comments = _hints(Config), field_comments(Config)
    lines: list[str] = [
        "<!-- generated by scripts/config_reference.py from recsys/config/ and data_pipelines/config.py: edit the",
        "     fields' comments there, then `make docs` (or python scripts/config_reference.py) rewrites this page -->",
        "",
        "# Configuration reference",
        "",
        "<!-- test: config -->",
        "```bash",
        ".venv/bin/python -m recsys.train --cfg job      # the composed config of a run, without running it",
        "```",
        "",
        "Every key of every entry point, its type, its default and its meaning. Set any key on the command line",
        "(`python -m recsys.train trainer.epochs=3 model.loss.temperature=0.05`), choose a group's option",
        "(`data=gowalla`, `optim/sparse=sgd`), or apply an experiment, a file of settings",
        "(`+experiment=tiny`, `conf/experiment/`). A misspelt key or a value of the wrong type stops the run",
        "before any work, naming the key. Required values are `???`. The defaults below are what",
        "`python -m recsys.train` composes from `conf/config.yaml` (its default group options); a group option",
        "or an experiment changes several of them, as its file in `conf/` says.",
        "",
        "## Config groups",
        "",
        *_groups([g for keys in GROUPS.values() for g in keys] + ["experiment"], defaults),
        "",
        "Experiments are overlays (`# @package _global_`): `+experiment=NAME` applies one on top of the groups.",
    ]
    for name in [f.name for f in dataclasses.fields(Config)]:
        if dataclasses.is_dataclass(hints[name]):
            lines += ["", f"## `{name}`", "", _cell(comments[name]), ""]
            lines += list(_sections(hints[name], f"{name}.", training[name], 3))
    lines += ["", "## Top-level keys", "", *_table(Config, "", training)]
    for heading, schema, config_name, shared in ENTRY_POINTS:
        composed = OmegaConf.to_container(compose(config_name), resolve=False, enum_to_str=True)
        lines += ["", f"## {heading}", "", _cell((schema.__doc__ or "").strip().splitlines()[0]), ""]
        if shared:
            lines += [
                f"Its {', '.join(f'`{k}`' for k in shared)} keys and groups are the training config's (above).",
                "",
            ]
        lines += list(_sections(schema, "", composed, 3, skip=shared))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    if not PAGE.exists() or PAGE.read_text() != text:
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
