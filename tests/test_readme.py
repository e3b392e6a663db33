"""The README's examples run: the serving snippet against a freshly exported tiny bundle."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    matching = [b for b in blocks if containing in b]
    assert len(matching) == 1, f"README.md: expected one python block with {containing!r}, found {len(matching)}"
    return matching[0]


@pytest.fixture
def bundle(trained_run):
    """The shared tiny run's bundle (tests/conftest.py): export_run(ExportConfig(run_dir=...))."""
    return trained_run.bundle


def test_readme_serving_example_runs(bundle):
    code = readme_python_block("load_bundle")
    assert code.count('"runs/default/export"') == 1
    scope: dict = {}
    exec(compile(code.replace('"runs/default/export"', repr(str(bundle))), "README.md", "exec"), scope)
    user_ids, top10, scores = scope["user_ids"], scope["top10_each"], scope["scores"]
    assert top10.shape == (len(user_ids), 10) and scores.shape == (len(user_ids), 300)
    assert not set(scope["history_items"][:2].tolist()) & set(top10[0].tolist())  # the masked items are not recommended
    # what the example says it computes: inner products with the bundle's item embeddings, best first
    expected = scope["queries"] @ torch.from_numpy(np.load(bundle / "item_embeddings.npy")).t()
    assert torch.equal(top10[1], expected[1].topk(10).indices)
    # recommend(): the same ranking for one user's history, from the FAISS index, the history masked
    one = scope["bundle"].encode(np.array([0]), np.array([3]), scope["history"])
    exact = (one @ torch.from_numpy(np.load(bundle / "item_embeddings.npy")).t())[0]
    exact[scope["history"]] = -float("inf")
    assert scope["top10"].tolist() == exact.topk(10).indices.tolist() and len(scope["top10_scores"]) == 10


def test_results_table_script_writes_the_readme_table_format():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", README.parent / "scripts" / "results_table.py")
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

    report = {"splits": {"valid": split(0.5), "test": split(0.25)}, "ease": {"lambda": 1000.0}}
    report["splits"]["test"]["metrics"]["ease"]["recall@10"] = 0.28104
    lines = script.results_table(report).splitlines()
    assert lines[0] == script.HEADER and lines[1] == "|---|---|---|---|---|---|---|---|"
    assert lines[2] == "| two-tower | 0.0250 | 0.0500 | 0.1250 | 0.2500 | 0.0250 | 0.0500 | 0.2500 |"
    assert lines[3].startswith("| EASE (λ = 1000, tuned on valid) | 0.2810 | 0.0500 |")
    del report["splits"]["test"]["metrics"]["ease"]  # EASE skipped: no row
    assert [line.split(" | ")[0] for line in script.results_table(report).splitlines()[2:]] == [
        "| two-tower",
        "| popularity",
    ]


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
        with initialize_config_dir(config_dir=str(README.parent / "conf"), version_base="1.3", job_name=entry):
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
