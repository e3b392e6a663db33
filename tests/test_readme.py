"""The README's examples run: the serving snippet against a freshly exported tiny bundle."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recsys.export import ExportConfig, export_run
from recsys.trainer import fit
from tests.conftest import tiny_config

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    matching = [b for b in blocks if containing in b]
    assert len(matching) == 1, f"README.md: expected one python block with {containing!r}, found {len(matching)}"
    return matching[0]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, data_root, process_group):
    run_dir = tmp_path_factory.mktemp("readme_run")
    cfg = tiny_config([f"data.root={data_root}", "trainer.epochs=1", "trainer.max_steps_per_epoch=5"])
    fit(cfg, run_dir)
    (run_dir / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / ".hydra" / "config.yaml")  # as `python -m recsys.train` writes it
    return export_run(ExportConfig(run_dir=str(run_dir)))


def test_readme_serving_example_runs(bundle):
    code = readme_python_block("load_bundle")
    assert code.count('"runs/default/export"') == 1
    scope: dict = {}
    exec(compile(code.replace('"runs/default/export"', repr(str(bundle))), "README.md", "exec"), scope)
    user_ids, top10, scores = scope["user_ids"], scope["top10"], scope["scores"]
    assert top10.shape == (len(user_ids), 10) and scores.shape == (len(user_ids), 300)
    assert not set(scope["history_items"][:2].tolist()) & set(top10[0].tolist())  # the masked items are not recommended
    # what the example says it computes: inner products with the bundle's item embeddings, best first
    expected = scope["queries"] @ torch.from_numpy(np.load(bundle / "item_embeddings.npy")).t()
    assert torch.equal(top10[1], expected[1].topk(10).indices)
