"""scripts/bench_train.py's device plumbing: every way's step reads only tensors on the bench's device.

``--device cuda`` fails on a CPU tensor left in a CUDA step ("Expected all tensors to be on the same device"); with no
GPU here, the meta device stands in for it: a copy that is missed leaves a CPU tensor beside meta ones. Meta kernels
do not check devices themselves (embedding_bag takes CPU ids with meta weights), so a dispatch mode checks every op.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.helpers.scripts import load_script

META = torch.device("meta")


bench = load_script("bench_train")
# every feature kind the bench has: user, history bags and their categories, item categories, one side feature
TINY = bench.Shape(
    batch_size=32,
    num_users=60,
    num_items=50,
    num_categories=6,
    history_length=5,
    num_side_features=1,
    side_rows=10,
    loader_users=40,
    loader_per_user=12,
)


def tiny_inputs(device: torch.device):
    data = bench.synthetic_data(TINY)
    return data, bench.prepare_inputs(TINY, data, bench.parse_args(["--num-batches", "2"]), device)


class DevicesSeen(TorchDispatchMode):
    """The device of every tensor that an op takes or returns while active, with the op's name; 0-dim CPU tensors
    apart (a CUDA kernel takes those as scalars: Adam's step counts, constants)."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs or {}, out))[0]:
            if isinstance(t, torch.Tensor) and not (t.dim() == 0 and t.device.type == "cpu"):
                self.seen.add((str(func), t.device.type))
        return out


def test_every_way_steps_on_the_bench_device_from_the_same_loss(process_group):
    """The three ways built as the bench builds them: nothing their steps read is off the device, one step each
    trains, and all three start from the same loss (same weights, same batch)."""
    data, inputs = tiny_inputs(process_group.device)
    ways, state_mb = bench.build_ways(TINY, data, inputs, ["recsys", "plain", "unfused"], process_group)
    assert set(ways) == set(state_mb) == {"recsys", "plain", "unfused"}
    losses = {}
    for name, way in ways.items():
        assert bench.misplaced(way, process_group.device) == [], name
        losses[name] = float(way.step(0))
        assert way.step(1).isfinite()
    assert losses["plain"] == pytest.approx(losses["recsys"], rel=1e-5)
    assert losses["unfused"] == pytest.approx(losses["recsys"], rel=1e-5)


def test_inputs_of_every_way_are_copied_to_the_device_whole(process_group):
    """prepare_inputs for a device that is not the host's: every tensor of every pre-built batch is there, the plain
    way's (ids, offsets) for every (side, table) and the candidates' item ids included."""
    _, inputs = tiny_inputs(META)
    assert len(inputs.batches) == len(inputs.plain) == 2
    for x in inputs.batches + inputs.plain:
        named = bench.named_tensors(x)
        assert {name for name, _ in named} >= {"candidate_item_ids"}
        assert [name for name, t in named if t.device != META] == []
    keys = inputs.batches[0].features.keys()
    assert set(inputs.plain[0].tables) == {(side, key) for side in ("query", "candidate") for key in keys}


def test_plain_step_reads_nothing_from_the_host(process_group, monkeypatch):
    """The plain way with its model, logQ table and inputs on meta: every op of its step (forward, loss, backward,
    the towers' Adam) sees meta tensors only. SparseAdam's update cannot run on meta (no sparse coalesce there): it is
    left out; its state follows the tables' weights."""
    data, inputs = tiny_inputs(META)
    reference = bench.build_task(TINY, data).model
    weights = {c.name: torch.zeros(c.num_embeddings, c.embedding_dim) for c in reference.ebc.embedding_bag_configs()}
    log_q = torch.zeros(TINY.num_items)  # on the host: plain_way puts it on the device
    way = bench.plain_way(TINY, data, inputs, weights, {}, log_q, META)
    assert bench.misplaced(way, META) == []
    monkeypatch.setattr(torch.optim.SparseAdam, "step", lambda self, closure=None: None)
    with DevicesSeen() as mode:
        loss = way.step(0)
    assert loss.device == META
    assert {device for _, device in mode.seen} == {"meta"}, sorted(op for op, d in mode.seen if d != "meta")
    assert any("embedding_bag" in op for op, _ in mode.seen)  # the tables' lookups ran under the check


def test_misplaced_names_each_tensor_off_the_device(process_group):
    """What the bench checks before timing: a batch whose candidate ids stayed on the host, and a model weight
    left there, are named."""
    _, inputs = tiny_inputs(META)
    stray = bench.PlainInputs(inputs.plain[0].tables, torch.zeros(3, dtype=torch.int64), inputs.plain[0].num_queries)
    model = torch.nn.Linear(2, 2).to(META)
    model.bias = torch.nn.Parameter(torch.zeros(2))
    found = bench.misplaced(bench.Way(lambda i: None, [inputs.plain[1], stray], model), META)
    assert found == ["inputs[1].candidate_item_ids on cpu", "bias on cpu"]
