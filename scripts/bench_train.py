"""Training throughput of recsys vs. what a user would otherwise write, interleaved in one run.
(Over 400 lines: a standalone script; the plain-PyTorch rival it measures against has to be written out here.)

    $ .venv/bin/python scripts/bench_train.py --shape softmax     # batch 8192, the score matrix dominates
    $ .venv/bin/python scripts/bench_train.py --shape embedding   # batch 2048, 1e6-row tables, bags of 100
    $ .venv/bin/python scripts/bench_train.py --shape embedding --profile 10   # + torch.profiler per way
    $ .venv/bin/python scripts/bench_train.py --shape movielens   # batch 1024, ML-1M sizes (`make run`)
    $ .venv/bin/python scripts/bench_train.py --shape movielens --device cuda   # one GPU: samples/s per GPU
    $ .venv/bin/python scripts/bench_train.py --shape softmax --precision bf16  # recsys's step under bf16 autocast

The same two-tower (user / item / category tables, MLP towers [128, 64], in-batch softmax with
logQ correction, temperature 0.05) trained three ways on the same pre-built synthetic batches:

    (a) recsys     TwoTower + RetrievalTask, ``shard_model`` (table_wise, fbgemm's fused row-wise
                   Adagrad inside backward, Adam for the towers) in a one-process gloo group;
                   built by the trainer's builder (recsys.model.build) and stepped by its own
                   step (trainer.make_train_step): dmp(batch), backward, optimizer.step, zero_grad
    (b) plain      ``nn.EmbeddingBag(sparse=True)`` per table, ``torch.optim.SparseAdam`` for the
                   tables, Adam for the towers, the loss written inline as a user would
    (c) unfused    the same TwoTower with torchrec's EmbeddingBagCollection materialised on CPU,
                   no DMP: dense gradients, ``torch.optim.Adagrad`` over the tables, Adam for the towers

Shapes::

    softmax     batch 8192, users 1e5 x 64 (sum), items 5e4 x 64 (mean), 100 categories x 32 (mean),
                no history: query = user_id; candidate = item_id + item_categories (1-3)
    embedding   batch 2048, users 1e6 x 64, items 1e6 x 64, 1000 categories x 32, history bags of
                100 items (+ their categories), and 6 further categorical query features
                side_0..side_5 (one id each, tables of 1e5 x 16, sum). The model builder takes
                them as ``extra_tables``, built here by hand so that the timed batches stay those
                docs/performance.md reports (a run takes such columns by config: model.features);
                the loader measurement leaves them out.
    movielens   batch 1024, 6040 users, 3706 items, 18 categories, history bags of 20: the default
                dataset's (MovieLens-1M) shape with the default trainer, i.e. what `make run` trains

Steps are timed one by one; a round runs ``--steps`` steps of each way in turn (the order rotates
each round), the first ``--warmup`` steps of each way are dropped, and samples/s is batch size /
median step time; ratios are of those medians, and ``paired_ratio_*`` is the median over rounds
of the per-round ratio (robust to background load that comes and goes). Peak RSS is the process's ``ru_maxrss`` (all three models live in one process);
``*_state_mb`` is each way's parameters + optimizer state.

Devices (``--device cuda``: one GPU, NCCL): every way trains on the bench's device. The pre-built batches are
copied there once, before timing, from page-locked memory with ``non_blocking`` (the trainer's batches are pinned
too, and under ``trainer.pipeline=sparse_dist`` the next batch's copy overlaps the current step, so a step's time
holds no copy); the plain way's (ids, offsets) per table and the candidates' item ids are copied the same way. Before
timing, every tensor each way's step reads (its inputs, its model's parameters and buffers) is checked to be on the
device (a SystemExit names any that is not). Each timed step is bracketed by ``torch.cuda.synchronize``: it counts
its kernels, not just their launch.

The loader is measured apart: ``TrainBatches.epoch`` (what the trainer iterates; built here
without its prefetch thread) over the same synthetic dataset, batches per second after the first
batch (which also draws the epoch's permutation) vs. recsys's steps per second (target >= 5x).
The timed batches are pre-built from that dataset's epoch 0 (plus the side features).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recsys.config import (
    DenseOptimConfig,
    ModelConfig,
    ShardingConfig,
    SparseOptimConfig,
    TableConfig,
    TableShardingConfig,
)  # fmt: skip
from recsys.data.batch import Batch
from recsys.data.batch_bounds import ceil_div
from recsys.data.batches import TrainBatches
from recsys.data.dataset import Interactions, RetrievalData
from recsys.distributed.env import destroy_distributed, init_distributed
from recsys.distributed.sharding import shard_model
from recsys.model.build import build_retrieval_task
from recsys.model.task import RetrievalTask
from recsys.training.trainer import make_train_step


@dataclass(frozen=True)
class Shape:
    batch_size: int
    num_users: int
    num_items: int
    num_categories: int
    history_length: int
    num_side_features: int
    side_rows: int
    loader_users: int  # users with interactions in the loader's dataset
    loader_per_user: int  # interactions each


SHAPES = {
    "softmax": Shape(8192, 100_000, 50_000, 100, 0, 0, 0, 100_000, 20),
    "embedding": Shape(2048, 1_000_000, 1_000_000, 1000, 100, 6, 100_000, 20_000, 300),
    # the default dataset's (MovieLens-1M) shape and the default trainer: what `make run` trains
    "movielens": Shape(1024, 6040, 3706, 18, 20, 0, 0, 6040, 132),
}
SIDE_DIM = 16
TOWER_DIMS = [128, 64]
TEMPERATURE = 0.05
MODEL = ModelConfig(
    tables={"user": TableConfig(64, "sum"), "item": TableConfig(64, "mean"), "category": TableConfig(32, "mean")},
    tower_dims=TOWER_DIMS,
    # the plain loss below masks the accidental hits only, as a user writes it: the same loss needs no history mask
    loss={"name": "softmax", "temperature": TEMPERATURE, "logq_correction": True, "mask_history": False},
    item_bias=False,  # the plain model below ends both towers unit vectors, as a user writes it
)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


# ---------------------------------------------------------------- data


def synthetic_data(shape: Shape, seed: int = 0) -> RetrievalData:
    """An in-memory RetrievalData: ``loader_users`` users with ``loader_per_user`` time-ordered
    interactions each, items drawn with Zipf-like popularity (p ~ 1 / (rank + 10))."""
    rng = np.random.default_rng(seed)
    users = np.sort(rng.choice(shape.num_users, shape.loader_users, replace=False))
    user_ids = np.repeat(users, shape.loader_per_user).astype(np.int64)
    n = len(user_ids)
    popularity = 1.0 / (np.arange(shape.num_items) + 10.0)
    cdf = np.cumsum(popularity / popularity.sum())
    item_ids = np.minimum(np.searchsorted(cdf, rng.random(n)), shape.num_items - 1).astype(np.int64)
    item_ids = rng.permutation(shape.num_items)[item_ids]  # popular ids spread over the table
    timestamps = np.tile(np.arange(shape.loader_per_user, dtype=np.int64), shape.loader_users)
    train = Interactions(user_ids, item_ids, timestamps)
    empty = Interactions(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
    cats_per_item = rng.integers(1, 4, shape.num_items)
    indptr = np.concatenate([[0], np.cumsum(cats_per_item)]).astype(np.int64)
    category_ids = rng.integers(0, shape.num_categories, int(indptr[-1])).astype(np.int64)
    return RetrievalData(
        dir=Path("."),
        meta={"name": "bench"},
        num_users=shape.num_users,
        num_items=shape.num_items,
        num_categories=shape.num_categories,
        splits={"train": train, "valid": empty, "test": empty},
        item_category_indptr=indptr,
        item_category_ids=category_ids,
    )


def side_keys(shape: Shape) -> list[str]:
    return [f"side_{j}" for j in range(shape.num_side_features)]


def with_side_features(batch: Batch, shape: Shape, rng: np.random.Generator) -> Batch:
    """Append one id per query row for each side feature (empty bags on negative rows)."""
    if not shape.num_side_features:
        return batch
    kjt, n = batch.features, batch.num_queries
    stride = kjt.stride()
    keys = side_keys(shape)
    side_values = torch.from_numpy(rng.integers(0, shape.side_rows, (len(keys), n)).reshape(-1))
    side_lengths = torch.zeros(len(keys), stride, dtype=kjt.lengths().dtype)
    side_lengths[:, :n] = 1
    features = KeyedJaggedTensor(
        keys=kjt.keys() + keys,
        values=torch.cat([kjt.values(), side_values]),
        lengths=torch.cat([kjt.lengths(), side_lengths.reshape(-1)]),
    )
    return dataclasses.replace(batch, features=features)


@dataclass
class PlainInputs:
    """One batch as a user without torchrec holds it: nn.EmbeddingBag's (ids, offsets) per (side, table), query rows
    and candidate rows apart (history ids and candidate ids as separate tensors), and the candidates' item ids
    (logQ, accidental hits). Everything the plain way's step reads."""

    tables: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]]
    candidate_item_ids: torch.Tensor
    num_queries: int

    def to(self, device: torch.device, non_blocking: bool = False) -> PlainInputs:
        return PlainInputs(
            {
                k: (v.to(device, non_blocking=non_blocking), o.to(device, non_blocking=non_blocking))
                for k, (v, o) in self.tables.items()
            },
            self.candidate_item_ids.to(device, non_blocking=non_blocking),
            self.num_queries,
        )

    def pin_memory(self) -> PlainInputs:
        return PlainInputs(
            {k: (v.pin_memory(), o.pin_memory()) for k, (v, o) in self.tables.items()},
            self.candidate_item_ids.pin_memory(),
            self.num_queries,
        )


def to_plain_inputs(batch: Batch) -> PlainInputs:
    """KJT -> PlainInputs (on the batch's device)."""
    n = batch.num_queries
    tables = {}
    for key, jt in batch.features.to_dict().items():
        values, offsets = jt.values().long(), jt.offsets().long()
        tables[("query", key)] = (values[: offsets[n]], offsets[:n])
        tables[("candidate", key)] = (values[offsets[n] :], offsets[n:-1] - offsets[n])
    return PlainInputs(tables, batch.candidate_item_ids, n)


def named_tensors(x) -> list[tuple[str, torch.Tensor]]:
    """Every tensor a step reads from ``x`` (a Batch or PlainInputs), by name."""
    if isinstance(x, PlainInputs):
        out = [
            (f"{side}.{key}.{part}", t)
            for (side, key), pair in x.tables.items()
            for part, t in zip(("ids", "offsets"), pair)
        ]
        return out + [("candidate_item_ids", x.candidate_item_ids)]
    kjt = x.features
    parts = {
        "values": kjt.values(),
        "lengths": kjt.lengths_or_none(),
        "offsets": kjt.offsets_or_none(),
        "weights": kjt.weights_or_none(),
    }
    return [(f"features.{k}", t) for k, t in parts.items() if t is not None] + [
        ("candidate_item_ids", x.candidate_item_ids)
    ]


def to_device(host: list, device: torch.device) -> list:
    """Each pre-built batch (Batch or PlainInputs) copied to ``device``, once, before timing. On CUDA the trainer's
    way: from page-locked memory with non_blocking (recsys.job.run pins its batches), then one synchronize, so that no
    copy is still in flight when the first step is timed."""
    if device.type != "cuda":
        return [b.to(device) for b in host]
    out = [b.pin_memory().to(device, non_blocking=True) for b in host]
    torch.cuda.synchronize(device)
    return out


# ---------------------------------------------------------------- models


def side_tables(shape: Shape) -> list[EmbeddingBagConfig]:
    """The bench's further categorical query features: one table each, looked up by the key of its name."""
    return [
        EmbeddingBagConfig(
            name=key,
            num_embeddings=shape.side_rows,
            embedding_dim=SIDE_DIM,
            feature_names=[key],
            pooling=PoolingType.SUM,
        )
        for key in side_keys(shape)
    ]


def build_task(shape: Shape, data: RetrievalData) -> RetrievalTask:
    """recsys's model for ``shape``, from the builder the trainer uses (plus the side tables)."""
    return build_retrieval_task(
        MODEL,
        num_rows=data.table_num_rows,
        history_length=shape.history_length,
        item_counts=torch.from_numpy(data.item_counts()),
        seed=0,
        extra_tables=side_tables(shape),
    )


def build_recsys(shape: Shape, data: RetrievalData, env):
    task = build_task(shape, data)
    names = [c.name for c in task.model.ebc.embedding_bag_configs()]
    sharding = ShardingConfig(
        tables={t: TableShardingConfig(sharding_types=["table_wise"], compute_kernels=["fused"]) for t in names},
        device=env.device.type,
        backend=env.backend,
    )
    # one process: the task's default (local candidates) is what the trainer installs for world size 1
    return shard_model(task, sharding=sharding, sparse=SparseOptimConfig(), dense=DenseOptimConfig(), env=env, seed=0)


def table_weights(sharded) -> dict[str, torch.Tensor]:
    """Full table weights of a one-process table_wise DMP (each table is one local shard)."""
    out = {}
    for key, value in sharded.module.state_dict().items():
        if ".embedding_bags." in key and key.endswith(".weight"):
            shards = value.local_shards()
            out[key.split(".")[-2]] = shards[0].tensor.detach().clone()
    return out


class PlainTwoTower(nn.Module):
    """What a user writes without torchrec: one nn.EmbeddingBag(sparse=True) per table, called once
    per side (the item table for the history bags, then again for the candidates)."""

    def __init__(self, configs: list[EmbeddingBagConfig], query_tables: list[str], candidate_tables: list[str]):
        super().__init__()
        self.tables = nn.ModuleDict(
            {
                c.name: nn.EmbeddingBag(c.num_embeddings, c.embedding_dim, mode=c.pooling.name.lower(), sparse=True)
                for c in configs
            }
        )
        dim = {c.name: c.embedding_dim for c in configs}
        self.query_tables, self.candidate_tables = query_tables, candidate_tables
        from recsys.model.two_tower import mlp

        self.query_tower = mlp(sum(dim[t] for t in query_tables), TOWER_DIMS)
        self.candidate_tower = mlp(sum(dim[t] for t in candidate_tables), TOWER_DIMS)

    def forward(self, inputs: PlainInputs):
        q = torch.cat([self.tables[t](*inputs.tables[("query", t)]) for t in self.query_tables], dim=1)
        c = torch.cat([self.tables[t](*inputs.tables[("candidate", t)]) for t in self.candidate_tables], dim=1)
        return F.normalize(self.query_tower(q), dim=-1), F.normalize(self.candidate_tower(c), dim=-1)


def plain_loss(queries, candidates, item_ids, log_q_table, num_queries):
    """In-batch softmax with logQ and accidental-hit masking, as a user would write it."""
    logits = queries @ candidates.t() / TEMPERATURE - log_q_table[item_ids].unsqueeze(0)
    labels = torch.arange(num_queries, device=item_ids.device)
    hits = item_ids[:num_queries].unsqueeze(1) == item_ids.unsqueeze(0)
    hits[labels, labels] = False
    return F.cross_entropy(logits.masked_fill(hits, float("-inf")), labels)


# ---------------------------------------------------------------- bench


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="softmax")
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs --steps steps of every way")
    p.add_argument("--steps", type=int, default=6, help="steps of one way per round")
    p.add_argument(
        "--warmup", type=int, default=6, help="first steps of each way not counted (first-touch page faults, allocator)"
    )
    p.add_argument("--num-batches", type=int, default=4, help="distinct pre-built batches, cycled")
    p.add_argument("--loader-batches", type=int, default=40, help="batches drawn from TrainBatches.epoch")
    p.add_argument("--ways", default="recsys,plain,unfused", help="subset to run (ratios need all three)")
    p.add_argument("--profile", type=int, default=0, help="after timing, profile this many steps of each way")
    p.add_argument("--profile-rows", type=int, default=15, help="operators listed per profiled way")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads; 0 = torch's default")
    p.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16"], help="trainer.precision of the recsys way only"
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: one GPU (NCCL), batches copied there (pinned, non_blocking) before timing, each step synchronised",
    )
    return p.parse_args(argv)


@dataclass
class Inputs:
    """The pre-built batches every way trains on, copied to the bench's device before timing, and their loader."""

    source: TrainBatches
    batches: list[Batch]  # recsys / unfused input: one KJT each
    plain: list[PlainInputs]  # the same batches as the plain way holds them


def prepare_inputs(shape: Shape, data: RetrievalData, args, device: torch.device) -> Inputs:
    source = TrainBatches(
        data, history_length=shape.history_length, global_batch_size=shape.batch_size, num_negatives=0, seed=0
    )
    rng = np.random.default_rng(1)
    host = [with_side_features(b, shape, rng) for _, b in zip(range(args.num_batches), source.epoch(0))]
    B = shape.batch_size
    mean_hist = host[0].features["item"].lengths()[:B].float().mean().item() if shape.history_length else 0.0
    print(
        f"shape {args.shape}: {shape}; mean history bag {mean_hist:.1f}; torch threads {torch.get_num_threads()}",
        flush=True,
    )
    return Inputs(source, to_device(host, device), to_device([to_plain_inputs(b) for b in host], device))


@dataclass
class Way:
    """One way of training: ``step(i)`` trains on pre-built batch ``i`` (cycled) and reads only ``inputs`` (a Batch or
    PlainInputs per batch) and ``module``'s parameters and buffers (its optimizers' state follows them)."""

    step: Callable[[int], torch.Tensor]
    inputs: list
    module: nn.Module


def misplaced(way: Way, device: torch.device) -> list[str]:
    """What ``way``'s step reads that is not on ``device``: "NAME on DEVICE" per tensor (empty: nothing)."""
    found = [
        f"inputs[{i}].{name} on {t.device}"
        for i, x in enumerate(way.inputs)
        for name, t in named_tensors(x)
        if t.device != device
    ]
    model = list(way.module.named_parameters()) + list(way.module.named_buffers())
    return found + [f"{name} on {t.device}" for name, t in model if t.device != device]


def recsys_way(sharded, inputs: Inputs, env, precision: str = "fp32") -> Way:
    """The trainer's own step (``make_train_step``, at trainer.precision ``precision``) on batch ``i`` of the
    pre-built ones (already on the device: the step's own non_blocking copy is then a no-op)."""
    sharded.module.train()
    _, train_step = make_train_step("none", sharded, env, precision)
    return Way(lambda i: train_step(iter([inputs.batches[i % len(inputs.batches)]])), inputs.batches, sharded.module)


def plain_way(shape: Shape, data: RetrievalData, inputs: Inputs, weights, towers, log_q, device) -> Way:
    reference = build_task(shape, data).model  # the same tables and towers, read by the plain model
    plain = PlainTwoTower(reference.ebc.embedding_bag_configs(), reference.query_keys, reference.candidate_keys).to(
        device
    )
    plain.register_buffer("log_q", log_q.to(device), persistent=False)  # logQ of every item, read by the loss
    with torch.no_grad():
        for t, w in weights.items():
            plain.tables[t].weight.copy_(w)
        plain.load_state_dict(towers, strict=False)
    sparse_opt = torch.optim.SparseAdam(list(plain.tables.parameters()), lr=1e-3)
    dense_opt = torch.optim.Adam(
        list(plain.query_tower.parameters()) + list(plain.candidate_tower.parameters()), lr=1e-3
    )

    def plain_step(i: int) -> torch.Tensor:
        batch = inputs.plain[i % len(inputs.plain)]
        q, c = plain(batch)
        loss = plain_loss(q, c, batch.candidate_item_ids, plain.log_q, batch.num_queries)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        return loss.detach()

    return Way(plain_step, inputs.plain, plain)


def unfused_way(shape: Shape, data: RetrievalData, inputs: Inputs, weights, towers, device) -> Way:
    task = build_task(shape, data)
    configs = task.model.ebc.embedding_bag_configs()
    task.model.ebc = EmbeddingBagCollection(tables=configs, device=device)
    task.to(device)
    with torch.no_grad():
        for t, w in weights.items():
            task.model.ebc.embedding_bags[t].weight.copy_(w)
        task.model.load_state_dict(towers, strict=False)
    table_opt = torch.optim.Adagrad(task.model.ebc.parameters(), lr=0.05)
    tower_opt = torch.optim.Adam(
        list(task.model.query_tower.parameters()) + list(task.model.candidate_tower.parameters()), lr=1e-3
    )

    def unfused_step(i: int) -> torch.Tensor:
        loss, _ = task(inputs.batches[i % len(inputs.batches)])
        loss.backward()
        table_opt.step()
        tower_opt.step()
        table_opt.zero_grad()
        tower_opt.zero_grad()
        return loss.detach()

    return Way(unfused_step, inputs.batches, task)


def build_ways(shape: Shape, data: RetrievalData, inputs: Inputs, ways: list[str], env, precision: str = "fp32"):
    """(Way per way, parameters + optimizer state in MB per way); every way starts from recsys's weights, and its
    step reads nothing off the bench's device (checked here: SystemExit naming the tensors otherwise)."""
    built: dict[str, Way] = {}
    state_mb: dict[str, float] = {}
    sharded = build_recsys(shape, data, env)
    weights = table_weights(sharded)
    towers = {k: v for k, v in sharded.two_tower.state_dict().items() if "_tower." in k}
    if "recsys" in ways:
        built["recsys"] = recsys_way(sharded, inputs, env, precision)
        # weights + row-wise Adagrad's one float per row
        state_mb["recsys"] = sum(w.numel() * 4 + w.shape[0] * 4 for w in weights.values()) / 2**20
    else:
        del sharded
    log_q = build_task(shape, data).candidate_log_q(torch.arange(shape.num_items), shape.batch_size)
    if "plain" in ways:
        built["plain"] = plain_way(shape, data, inputs, weights, towers, log_q, env.device)
        state_mb["plain"] = 3 * sum(w.numel() * 4 for w in weights.values()) / 2**20  # weights + 2 Adam moments
    if "unfused" in ways:
        built["unfused"] = unfused_way(shape, data, inputs, weights, towers, env.device)
        state_mb["unfused"] = 3 * sum(w.numel() * 4 for w in weights.values()) / 2**20  # weights + grads + Adagrad sum
    del weights
    gc.collect()
    for name, way in built.items():
        if off := misplaced(way, env.device):
            raise SystemExit(f"bench_train: the {name} way's step reads tensors off {env.device}: {', '.join(off[:5])}")
    return built, state_mb


def time_rounds(steps, args, batch_size: int, sync) -> tuple[dict[str, list[float]], dict[str, float], dict[str, int]]:
    """(step times per way, first-step loss per way, steps taken per way): ``args.rounds`` rounds, the order rotating."""
    times: dict[str, list[float]] = {w: [] for w in steps}
    first_loss: dict[str, float] = {}
    counters = {w: 0 for w in steps}
    names = list(steps)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for w in order:
            for _ in range(args.steps):
                sync()  # nothing of the previous step (or way) still running on the device
                t0 = time.perf_counter()
                loss = steps[w](counters[w])
                sync()
                times[w].append(time.perf_counter() - t0)
                if counters[w] == 0:
                    first_loss[w] = float(loss)
                counters[w] += 1
        print(
            f"round {r}: "
            + ", ".join(f"{w} {batch_size / statistics.median(times[w][-args.steps :]):,.0f}/s" for w in order),
            flush=True,
        )
    print("first-step loss (same weights, same batch): " + ", ".join(f"{w} {v:.5f}" for w, v in first_loss.items()))
    return times, first_loss, counters


def paired_ratios(times: dict[str, list[float]], args) -> dict[str, float]:
    """Per round, the other way's mean step time over recsys's (adjacent in time, so a background job
    that slows the machine for a while slows both); median over rounds."""
    first_round = ceil_div(args.warmup, args.steps)
    paired = {}
    if "recsys" in times:
        for w in times:
            if w != "recsys":
                per_round = [
                    statistics.mean(times[w][r * args.steps : (r + 1) * args.steps])
                    / statistics.mean(times["recsys"][r * args.steps : (r + 1) * args.steps])
                    for r in range(first_round, args.rounds)
                ]
                if per_round:
                    paired[w] = statistics.median(per_round)
    return paired


def profile_ways(steps, counters, args, device: torch.device, sync) -> None:
    """Where each way's step goes: torch.profiler, operators by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    for w in steps:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(args.profile):
                steps[w](counters[w])
                counters[w] += 1
            sync()
        print(f"--- {w}: {args.profile} steps")
        print(
            prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=args.profile_rows, max_name_column_width=60
            )
        )


def measure_loader(source: TrainBatches, num_batches: int) -> tuple[float, float]:
    """(batches/s of what the trainer iterates, seconds of the first batch): prefetch=0, the building itself;
    the first batch also draws the epoch's permutation."""
    source.prefetch = 0
    t0 = time.perf_counter()
    it = source.epoch(1)
    next(it)
    first_batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(num_batches):
        next(it)
    return num_batches / (time.perf_counter() - t0), first_batch_s


def summarize(args, B: int, samples_per_s, paired, state_mb, rss_before, loader, device: torch.device) -> dict:
    """The last line's JSON object."""
    result = {"shape": args.shape, "batch_size": B, "recsys_precision": args.precision}
    for w in ("recsys", "plain", "unfused"):
        if w in samples_per_s:
            result[f"{w}_samples_per_s"] = round(samples_per_s[w], 1)
    for w in ("plain", "unfused"):
        if "recsys" in samples_per_s and w in samples_per_s:
            result[f"ratio_vs_{w}"] = round(samples_per_s["recsys"] / samples_per_s[w], 3)
    for w in ("plain", "unfused"):
        if w in paired:
            result[f"paired_ratio_vs_{w}"] = round(paired[w], 3)
    result["peak_rss_mb"] = round(rss_mb(), 1)
    if device.type == "cuda":
        result["device"] = torch.cuda.get_device_name(device)
        result["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    result["rss_before_models_mb"] = round(rss_before, 1)
    result.update({f"{w}_state_mb": round(v, 1) for w, v in state_mb.items()})
    loader_batches_per_s, loader_first_batch_s = loader
    result["loader_batches_per_s"] = round(loader_batches_per_s, 2)
    result["loader_first_batch_s"] = round(loader_first_batch_s, 3)
    if "recsys" in samples_per_s:
        result["loader_vs_step"] = round(loader_batches_per_s / (samples_per_s["recsys"] / B), 2)
    result["torch_threads"] = torch.get_num_threads()
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    env = init_distributed(args.device, "auto")
    device = env.device

    def sync() -> None:  # a step's time includes its kernels, not just their launch
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    data = synthetic_data(shape)
    inputs = prepare_inputs(shape, data, args, device)
    rss_before = current_rss_mb()
    ways, state_mb = build_ways(shape, data, inputs, args.ways.split(","), env, args.precision)
    steps = {w: way.step for w, way in ways.items()}
    times, _, counters = time_rounds(steps, args, shape.batch_size, sync)
    samples_per_s = {w: shape.batch_size / statistics.median(t[args.warmup :]) for w, t in times.items()}
    paired = paired_ratios(times, args)
    if args.profile:
        profile_ways(steps, counters, args, device, sync)
    loader = measure_loader(inputs.source, args.loader_batches)
    result = summarize(args, shape.batch_size, samples_per_s, paired, state_mb, rss_before, loader, device)
    print(json.dumps(result), flush=True)
    steps.clear()
    ways.clear()
    gc.collect()
    destroy_distributed(env)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
