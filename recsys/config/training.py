"""The ``optim``, ``sharding`` and ``trainer`` sections of the training config: the optimizers, where tables
go, the training loop; ``check_optim`` and ``check_trainer`` refuse values no run can use."""

from __future__ import annotations

from dataclasses import dataclass, field

from data_pipelines.config import Choice, Protocol
from recsys.config.data import DataConfig
from recsys.config.model import ModelConfig
from recsys.config.need import Need
from recsys.utils.lr_schedule import SCHEDULES


class SparseOptimizer(Choice):
    """Fused into backward by fbgemm; the Adam / LAMB family has CUDA kernels only."""

    rowwise_adagrad = "rowwise_adagrad"
    adagrad = "adagrad"
    sgd = "sgd"
    adam = "adam"
    partial_rowwise_adam = "partial_rowwise_adam"
    lamb = "lamb"
    partial_rowwise_lamb = "partial_rowwise_lamb"


class DenseOptimizer(Choice):
    adam = "adam"
    adamw = "adamw"
    adagrad = "adagrad"
    sgd = "sgd"


class Device(Choice):
    auto = "auto"  # cuda if available
    cpu = "cpu"
    cuda = "cuda"


class Backend(Choice):
    auto = "auto"  # nccl on cuda, gloo on cpu
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class SparseOptimConfig:
    name: SparseOptimizer = (
        SparseOptimizer.rowwise_adagrad
    )  # fused: rowwise_adagrad | adagrad | sgd; GPU only: adam | partial_rowwise_adam | lamb | partial_rowwise_lamb
    lr: float = 0.05  # table learning rate
    eps: float = 1e-8  # Adagrad / Adam epsilon
    beta1: float = 0.9  # Adam / LAMB first-moment decay
    beta2: float = 0.999  # Adam / LAMB second-moment decay
    weight_decay: float = (
        0.0  # L2 on looked-up rows (CUDA only: fbgemm's CPU kernels ignore it, so CPU runs refuse it); 0 disables
    )


@dataclass
class DenseOptimConfig:
    name: DenseOptimizer = DenseOptimizer.adam  # tower optimizer
    lr: float = 3e-4  # tower learning rate (the default's measure: docs/quality.md)
    weight_decay: float = 0.0  # 0 disables


@dataclass
class OptimConfig:
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)  # fused into backward for every sharded table
    # the towers' optimizer (and that of any data_parallel table, which has no fused kernel)
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    # both optimizers' learning rates over training (recsys/utils/lr_schedule.py): "constant" | "linear" (down to 0
    # at the horizon); the horizon is optim.schedule_epochs, 0 = trainer.epochs (a refit keeps its selection's)
    schedule: str = "constant"
    schedule_epochs: int = 0  # the schedule's horizon in epochs; 0 = trainer.epochs


def check_optim(o: OptimConfig, need: Need) -> None:
    """optim.*: the learning-rate schedule (the optimizers' names are typed)."""
    need(o.schedule in SCHEDULES, "optim.schedule", o.schedule, f"expected one of {', '.join(SCHEDULES)}")
    need(o.schedule_epochs >= 0, "optim.schedule_epochs", o.schedule_epochs, "must be >= 0 (0: trainer.epochs)")


@dataclass
class TableShardingConfig:
    sharding_types: list[str] = field(default_factory=list)  # allowed torchrec sharding types; [] = planner decides
    compute_kernels: list[str] = field(
        default_factory=lambda: ["fused"]
    )  # "fused" | "fused_uvm_caching" (GPU) | "dense"
    cache_load_factor: float = 0.0  # fused_uvm_caching: share of rows cached in HBM; 0 = torchrec's default (0.2)


@dataclass
class ShardingConfig:
    tables: dict[str, TableShardingConfig] = field(default_factory=dict)  # per-table planner constraints
    device: Device = Device.auto  # where tables and towers live; auto = cuda if available
    backend: Backend = Backend.auto  # process-group backend
    hbm_cap_gb: float = (
        0.0  # GPU memory per device the planner may use, GB (2**30 bytes); 0 = the device's total memory
    )
    ddr_cap_gb: float = (
        0.0  # host memory per rank the planner may use (CPU tables, UVM), GB; 0 = this host's RAM / local ranks
    )


# Two names checked by check_values rather than typed as enums: their refusals say which values are allowed
# in the words users already know (and "none" would be no good enum member name for Hydra's parser).
PIPELINES = ("none", "sparse_dist")  # trainer.pipeline
PRECISIONS = ("fp32", "bf16", "auto")  # trainer.precision
LOADERS = ("auto", "device", "host")  # trainer.loader


@dataclass
class TrainerConfig:
    epochs: int = 8  # passes over the training split (upper bound with early stopping)
    global_batch_size: int = 1024  # examples per step summed over all ranks (shares differ by at most one row)
    seed: int = 0  # seeds table / tower init, shuffling and negative sampling
    early_stopping_patience: int = 2  # epochs without a better valid recall@20 before stopping; 0 disables
    log_every_steps: int = 100  # steps between loss / samples-per-second log lines
    progress_bar: bool = True  # tqdm on rank 0
    max_steps_per_epoch: int = 0  # cap on steps per epoch (smoke tests); 0 = the whole epoch
    pipeline: str = "none"  # one of PIPELINES: "none": plain loop | "sparse_dist": torchrec's TrainPipelineSparseDist (next batch's input all-to-all overlaps this step)
    # where the training batches are built: "device": torch ops on the training device from the rows and bags copied
    # there once | "host": numpy on the host, pinned and copied each step | "auto": device (docs/performance.md)
    loader: str = "auto"
    resume: str = "auto"  # "auto": newest complete checkpoint in the run dir, if any | "none": start over | a path
    init_from: str = ""  # a new run starts from these weights (a checkpoint dir, e.g. another run's checkpoints/best, or a run dir: its newest step checkpoint): fresh optimizer unless init_optimizer, step 0; "" = random / pretrained init; a resumed run ignores it
    init_optimizer: bool = False  # true: init_from's optimizer state too (a step checkpoint's: the incremental runs of docs/continuous-training.md)
    checkpoint_every_steps: int = 0  # also checkpoint every N steps inside an epoch; 0 = at epoch ends only
    keep_last_checkpoints: int = 2  # step checkpoints kept (the best-epoch weights are kept apart)
    # on SIGTERM (preemption) or Ctrl-C: finish the step, checkpoint, exit with status 75 (Ctrl-C: 130); seconds from
    # the signal to the exit at most (without a checkpoint if it takes longer): keep it below the scheduler's grace;
    # 0 = SIGTERM kills at once
    preemption_grace_s: float = 25.0
    fault_at_step: int = 0  # fault injection for tests: exit(13) after this step on the first attempt; 0 disables
    fault_rank: int = 0  # the rank that fails when fault_at_step is set
    # true: after early stopping, a fresh model is trained on train + valid for the best epoch + 1 epochs
    # (data.train_on_valid) in <run dir>/refit and tested; its test figures are the run's answer (and its bundle,
    # recsys.export's). null: where the training split has at most 250k rows (recsys/job/refit_rule.py, logged at start)
    refit: bool | None = None
    # "fp32" | "bf16" | "auto": the training step's towers and softmax matmuls in bfloat16 under autocast (fp32
    # accumulation, the softmax and every weight and optimizer state in fp32; evaluation in fp32). bf16 pays only
    # with native bf16 GEMMs (AVX512-BF16 / AMX CPUs, Ampere+ GPUs): a CPU without them emulates it, far slower
    # than fp32. "auto": bf16 where the device has them, else fp32 (the log says which)
    precision: str = "auto"


def check_trainer(t: TrainerConfig, m: ModelConfig, d: DataConfig, need: Need) -> None:
    """trainer.* (with the model and data settings it reads): batch size, epochs, refit, precision, logging,
    checkpoints, preemption, the step's pipeline."""
    need(t.global_batch_size >= 1, "trainer.global_batch_size", t.global_batch_size, "must be >= 1")
    # one candidate makes the softmax loss 0 (nothing is learnt): the batch's positives plus the sampled negatives
    need(
        t.global_batch_size < 1 or m.negatives.num == -1 or t.global_batch_size + m.negatives.num >= 2,
        "trainer.global_batch_size",
        t.global_batch_size,
        f"in-batch softmax needs >= 2 candidates per step, this leaves "
        f"{t.global_batch_size + m.negatives.num} (with model.negatives.num={m.negatives.num})",
    )
    need(t.epochs >= 1, "trainer.epochs", t.epochs, "must be >= 1")
    need(
        not (t.refit and d.train_on_valid),
        "trainer.refit",
        t.refit,
        "the refit is the second stage trainer.refit runs itself with data.train_on_valid=true: set one of the two",
    )
    need(
        not ((t.refit or d.train_on_valid) and d.protocol == Protocol.strong_generalization),
        "trainer.refit" if t.refit else "data.train_on_valid",
        True,
        "strong_generalization's valid users are held out (their rows are never training examples): "
        "there is nothing to refit on",
    )
    need(t.precision in PRECISIONS, "trainer.precision", t.precision, f"expected one of {', '.join(PRECISIONS)}")
    need(t.log_every_steps >= 1, "trainer.log_every_steps", t.log_every_steps, "must be >= 1")
    for key in (
        "early_stopping_patience",
        "max_steps_per_epoch",
        "checkpoint_every_steps",
        "keep_last_checkpoints",
        "fault_at_step",
    ):
        need(getattr(t, key) >= 0, f"trainer.{key}", getattr(t, key), "must be >= 0 (0 disables)")
    need(t.preemption_grace_s >= 0, "trainer.preemption_grace_s", t.preemption_grace_s, "must be >= 0 (0 disables)")
    need(t.pipeline in PIPELINES, "trainer.pipeline", t.pipeline, "expected 'none' or 'sparse_dist'")
    need(t.loader in LOADERS, "trainer.loader", t.loader, "expected 'auto', 'device' or 'host'")
