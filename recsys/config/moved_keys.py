"""Config keys that moved, and where to. A command line that still names one is refused before Hydra composes, with
the key's new place (Hydra alone says only "Key 'temperature' not in 'ModelConfig'"); run dirs written before the
moves are read with today's keys (recsys/rundir/saved_config.py).

    $ python -m recsys.train model.temperature=0.05
    error: config keys moved: model.temperature moved to model.loss.temperature: write model.loss.temperature=0.05
"""

from __future__ import annotations

from data_pipelines.errors import ConfigError

CCL = " (with model/loss=ccl)"
SASREC = " (with model/query_encoder=sasrec)"

# old key -> (new key, when it applies): losses and query encoders became components with sections of their own
MOVED_KEYS = {
    "model.temperature": ("model.loss.temperature", ""),
    "model.logq_correction": ("model.loss.logq_correction", ""),
    "model.logq_weight": ("model.loss.logq_weight", ""),
    "model.softmax_block_mb": ("model.loss.block_mb", ""),
    "model.margin": ("model.loss.margin", CCL),
    "model.negative_weight": ("model.loss.negative_weight", CCL),
    "model.num_uniform_negatives": ("model.negatives.num", ""),  # uniform: model.negatives.exponent's default, 0
}
MOVED_SECTIONS = {"model.sasrec.": ("model.query_encoder.", SASREC)}  # every key under the section
# keys that took a name and now choose a config group: model.loss=ccl is model/loss=ccl
GROUPS = {"model.loss": ("model/loss", "the loss"), "model.query_encoder": ("model/query_encoder", "the query encoder")}


def _split(override: str) -> tuple[str, str, str]:
    """A Hydra override's prefix (+, ++ or ~), key and value: "+model.x=1" -> ("+", "model.x", "1")."""
    key, _, value = override.partition("=")
    bare = key.lstrip("+~")
    return key[: len(key) - len(bare)], bare, value


def moved_key_problem(override: str) -> str | None:
    """What to write instead of ``override`` when it names a moved key; None when it names none."""
    prefix, key, value = _split(override)
    if key in GROUPS and value and all(name.isidentifier() for name in value.split(",")):  # names, not a section
        group, what = GROUPS[key]
        return f"{key}={value}: {what} is a config group now: write {group}={value}"
    new, when = MOVED_KEYS.get(key, (None, ""))
    for old_section, (new_section, section_when) in MOVED_SECTIONS.items():
        if key.startswith(old_section):
            new, when = new_section + key[len(old_section) :], section_when
    if new is None:
        return None
    written = f"{prefix}{new}={value}" if value else f"{prefix}{new}"
    return f"{key} moved to {new}{when}: write {written}"


def moved_keys_problem(overrides: list[str]) -> str | None:
    """Every moved key among the command line's ``overrides``, on one line; None when none is."""
    problems = [p for p in (moved_key_problem(o) for o in overrides if not o.startswith("-")) if p]
    return f"config keys moved: {'; '.join(problems)}" if problems else None


def refuse_moved_keys(overrides: list[str]) -> None:
    """A ConfigError naming each moved key's new place (an entry point prints it as one line)."""
    problem = moved_keys_problem(overrides)
    if problem:
        raise ConfigError(problem)
