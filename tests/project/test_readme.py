"""The README's and docs/'s examples run (tests/helpers/docs.py says how each block is marked).

- test_newcomer_walk: the path a new user follows from the README by links only, run end to end in one
  folder: train on a CSV log of their own (README), the same on 2 torchrun processes (gloo) (training at
  scale), export that run and ask its bundle for recommendations (serving).
- test_documented_commands_compose: every other command shown has its config composed and checked as its
  entry point would (a misspelt key, a removed option or a wrong value fails here).
- test_not_run: each block not run, with its reason (the skip reason pytest shows).
- the serving example, the results table's format and the entry points' --help, as before.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.helpers.docs import (
    DOCS,
    README,
    ROOT,
    Block,
    all_blocks,
    block_containing,
    blocks,
    command_lines,
    pages,
    parse_command,
)

# the pages a newcomer walks through, in order: the README, then the task pages its links lead to
WALK_PAGES = [README, DOCS / "training-at-scale.md", DOCS / "serving.md"]
SHOWN = [b for b in all_blocks() if b.shows_commands]


# ---------------------------------------------------------------- every block is covered, and says how


def test_every_code_block_says_which_test_covers_it():
    unmarked = [b.where for b in SHOWN if not b.kind]
    assert not unmarked, f"blocks without a <!-- test: ... --> or <!-- not run: ... --> marker: {unmarked}"
    for b in all_blocks():
        if b.kind == "test":
            assert b.is_walk or b.detail.startswith(("config", "tests/")), f"{b.where}: unknown marker {b.detail!r}"
        if b.kind == "not run":
            assert len(b.detail) > 10, f"{b.where}: say why the block is not run"
        if b.named_test:
            file, _, name = b.named_test.partition("::")
            assert (ROOT / file).is_file() and f"def {name}(" in (ROOT / file).read_text(), f"{b.where}: no {name}"
        if b.lang == "python" and b.kind == "test":
            assert b.is_walk or b.named_test, f"{b.where}: a python block is run by the walk or a named test"
    walked = {b.page for b in SHOWN if b.is_walk}
    assert walked == set(WALK_PAGES), "the walk's pages changed: update WALK_PAGES"


@pytest.mark.parametrize("block", [b for b in SHOWN if b.kind == "not run"], ids=lambda b: b.where)
def test_not_run(block: Block):
    pytest.skip(f"{block.where} not run: {block.detail}")


# ---------------------------------------------------------------- every command's config composes


def _variants(overrides: list[str]) -> list[list[str]]:
    """A sweep's overrides (``-m ... key=a,b,c``) as one list per value of each swept key, the others at their first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    swept = {i: list(o.sweep_string_iterator()) for i, o in enumerate(parsed) if o.is_sweep_override()}
    keys = [line.split("=", 1)[0] for line in overrides]
    return [
        [f"{keys[j]}={value if j == i else swept[j][0]}" if j in swept else line for j, line in enumerate(overrides)]
        for i, values in swept.items()
        for value in values
    ] or [overrides]


def check_config(argv: list[str]) -> None:
    """Compose the command's config as its entry point would, and convert and check it (without running);
    inside ``initialize_config_dir(conf/)``."""
    from hydra import compose

    from data_pipelines.config import to_typed
    from recsys.config import EvaluateConfig, ExportConfig, PlanConfig, to_config

    command = parse_command(argv)
    entry = {
        "recsys.train": ("config", to_config),
        "make run": ("config", to_config),
        "data_pipelines.prepare": ("config", to_config),  # prepare composes the training tree, reads data.*
        "recsys.evaluate": ("evaluate", lambda c: to_typed(c, EvaluateConfig)),
        "scripts/evaluate_recall.py": ("evaluate", lambda c: to_typed(c, EvaluateConfig)),
        "recsys.export": ("export", lambda c: to_typed(c, ExportConfig)),
        "scripts/plan_sharding.py": ("plan", lambda c: to_typed(c, PlanConfig)),
    }
    assert command.module in entry, f"{' '.join(argv)}: no config to check; mark the block <!-- not run: why -->"
    config_name, typed = entry[command.module]
    overrides, skip = [], False
    for arg in command.overrides:
        if skip or arg in ("-m", "--multirun", "--cfg", "--help"):
            skip = arg == "--cfg"  # --cfg takes a value (job / hydra / all)
            continue
        overrides.append(arg)
    for variant in _variants(overrides):
        typed(compose(config_name=config_name, overrides=variant))


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_compose(page: Path):
    from hydra import initialize_config_dir

    from recsys.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        for block in blocks(page):
            if block.kind == "not run" or not block.shows_commands or block.lang == "python":
                continue
            for argv in command_lines(block):
                try:
                    check_config(argv)
                except Exception as e:  # name the block and the command
                    raise AssertionError(f"{block.where}: {' '.join(argv)}\n{e}") from e


# ---------------------------------------------------------------- the newcomer's path, end to end


def write_clicks_csv(path: Path) -> None:
    """A log as a newcomer has one: string ids, ISO-8601 times, a header (the tiny synthetic dataset's rows)."""
    from data_pipelines.synthetic import TINY_SPEC, generate

    log, _, _ = generate(TINY_SPEC)
    pd.DataFrame(
        {
            "visitor": "v" + log["user_id"].astype(str),
            "sku": "sku" + log["item_id"].astype(str),
            "ts": pd.to_datetime(log["timestamp"], unit="s", utc=True).dt.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ).to_csv(path, index=False)


def run_command(argv: list[str], cwd: Path) -> None:
    """A documented command, as its user would run it from ``cwd``; trainings on the tiny experiment's sizes."""
    from tests.helpers.launch import launch

    command = parse_command(argv)
    args = list(command.overrides)
    if command.module == "recsys.train":
        args += ["+experiment=tiny", "trainer.epochs=1"]  # the tiny model, one epoch; the command's data and run
    launch(["-m", command.module, *args], nproc=command.nproc or 1, cwd=cwd, env=command.env, timeout=300)


@pytest.mark.multiprocess
def test_newcomer_walk(tmp_path, monkeypatch):
    write_clicks_csv(tmp_path / "clicks.csv")
    walk = [b for page in WALK_PAGES for b in blocks(page) if b.is_walk]
    assert [b.page for b in walk].count(README) == 2  # the README's ten lines: a command block, a python block
    monkeypatch.chdir(tmp_path)
    for block in walk:
        if block.lang == "python":
            scope: dict = {}
            exec(compile(block.text, block.where, "exec"), scope)
            top10, history = scope["top10"], np.asarray(scope["history"])
            assert len(top10) == 10 and (top10 >= 0).all() and not set(history.tolist()) & set(top10.tolist())
            continue
        for argv in command_lines(block):
            run_command(argv, tmp_path)
    for run in ("clicks", "clicks_2p"):  # the README's run and the torchrun job's, on the CSV
        results = json.loads((tmp_path / "runs" / run / "results.json").read_text())
        assert results["dataset"]["name"] == "interactions" and results["headline"]["servable"]
    manifest = json.loads((tmp_path / "runs" / "clicks_2p" / "export" / "manifest.json").read_text())
    assert manifest["index"] == "hnsw"


# ---------------------------------------------------------------- the serving example, the results table, --help


@pytest.fixture
def bundle(trained_run):
    """The shared tiny run's bundle (tests/conftest.py): export_run(ExportConfig(run_dir=...))."""
    return trained_run.bundle


def test_serving_example_runs(bundle):
    code = block_containing(DOCS / "serving.md", "bundle.encode(", lang="python").text
    assert code.count('"runs/default/export"') == 1
    scope: dict = {}
    exec(compile(code.replace('"runs/default/export"', repr(str(bundle))), "docs/serving.md", "exec"), scope)
    num_queries, top10, scores = len(scope["history_lengths"]), scope["top10_each"], scope["scores"]
    assert top10.shape == (num_queries, 10) and scores.shape == (num_queries, 300)
    assert not set(scope["history_items"][:2].tolist()) & set(top10[0].tolist())  # the masked items are not recommended
    # what the example says it computes: inner products with the bundle's item embeddings, best first
    expected = scope["queries"] @ torch.from_numpy(np.load(bundle / "item_embeddings.npy")).t()
    assert torch.equal(top10[1], expected[1].topk(10).indices)
    # recommend(): the same ranking for one user's history, from the FAISS index, the history masked
    one = scope["bundle"].encode(None, np.array([3]), scope["history"])
    exact = (one @ torch.from_numpy(np.load(bundle / "item_embeddings.npy")).t())[0]
    exact[scope["history"]] = -float("inf")
    assert scope["top10"].tolist() == exact.topk(10).indices.tolist() and len(scope["top10_scores"]) == 10


def test_results_table_script_writes_the_readme_table_format():
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.HEADER in README.read_text()  # the README's table is in the script's format

    def split(base):
        return {
            "metrics": {
                m: {f"{name}@{k}": base * k / 100 for name in ("recall", "ndcg") for k in (10, 20, 50, 100)}
                for m in ("two_tower", "ease", "popularity")
            },
            "breakdowns": {
                m: {
                    "item_popularity": {
                        "buckets": [{"bucket": "head", "recall@20": 0.9}, {"bucket": "tail", "recall@20": base}]
                    }
                }
                for m in ("two_tower", "ease", "popularity")
            },
        }

    report = {"splits": {"valid": split(0.5), "test": split(0.25)}}
    report["stage"] = {"rankers": {"ease": {"point": {"lambda": 1000.0}}}}
    report["splits"]["test"]["metrics"]["ease"]["recall@10"] = 0.28104
    lines = script.results_table(report).splitlines()
    assert lines[0] == script.HEADER and lines[1] == "|---|---|---|---|---|---|---|---|"
    assert lines[2] == "| two-tower | 0.0250 | 0.0500 | 0.1250 | 0.2500 | 0.0250 | 0.0500 | 0.2500 |"
    assert lines[3].startswith("| EASE (λ = 1000, tuned on valid) | 0.2810 | 0.0500 |")
    report["splits"]["test"]["metrics"]["two_tower+ease"] = report["splits"]["test"]["metrics"]["ease"]
    report["splits"]["test"]["breakdowns"]["two_tower+ease"] = report["splits"]["test"]["breakdowns"]["ease"]
    report["stage"]["rankers"]["two_tower+ease"] = {"point": {"lambda": 300.0, "beta": 0.1}}
    fused = script.results_table(report, served="two_tower+ease").splitlines()[3]  # after the two-tower, marked
    assert fused.startswith("| **two-tower + EASE (λ = 300, β = 0.1, tuned on valid): served** | 0.2810 |")
    del report["splits"]["test"]["metrics"]["two_tower+ease"]
    del report["splits"]["test"]["metrics"]["ease"]  # EASE skipped: no row
    assert [line.split(" | ")[0] for line in script.results_table(report).splitlines()[2:]] == [
        "| two-tower",
        "| popularity",
    ]


def test_readme_stays_short_and_links_only_existing_pages():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).is_file(), target


@pytest.mark.parametrize(
    "entry,keys",
    [("evaluate", ["max_users:", "out_dir:", "ann_kinds:"]), ("export", ["out_dir:", "checkpoint:", "device:"])],
)
def test_help_lists_the_entry_points_own_keys_only(entry, keys, capsys):
    """`python -m recsys.evaluate --help` (and export's): no training config groups, which do not apply there."""
    import importlib
    import logging

    from hydra import initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.core.global_hydra import GlobalHydra

    from recsys.config import register_configs

    importlib.import_module(f"recsys.{entry}")
    register_configs()  # what the entry point does before Hydra runs
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3", job_name=entry):
            parser = get_args_parser()
            GlobalHydra.instance().hydra.app_help(
                config_name=entry, args_parser=parser, args=parser.parse_args(["--help"])
            )
    finally:
        root.handlers, root.level = saved  # app_help configures Hydra's logging
    shown = capsys.readouterr().out
    assert shown.startswith(f"recsys.{entry}: ") and "run_dir: ???" in shown
    for key in keys:
        assert key in shown
    for group in ("Configuration groups", "optim/sparse", "sharding:", "experiment:"):
        assert group not in shown, group
