"""scripts/bench_run_step.py --profile: the step broken down by torch.profiler, and on a GPU its stall share."""

import time
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from tests.helpers.scripts import load_script

bench = load_script("bench_run_step")


def test_busy_ms_counts_overlapping_spans_once():
    """Kernels on two streams that overlap are busy time once (microseconds in, milliseconds out)."""
    assert bench.busy_ms([(3000, 4000), (0, 1000), (500, 1500), (3100, 3200)]) == pytest.approx(2.5)
    assert bench.busy_ms([]) == 0.0


def test_profile_of_a_cpu_run_reports_its_steps(data_root, tiny_data, process_group):
    out = bench.main(
        ["+experiment=tiny", f"data.root={data_root}", "--device", "cpu"]
        + ["--batches", "3", "--rounds", "1", "--warmup", "1", "--profile", "2"]
    )
    assert out["profile"]["steps"] == 2 and out["profile"]["wall_ms_per_step"] > 0
    assert "stall_share" not in out["profile"]  # the device's idle share is a GPU figure


def test_profile_on_a_gpu_asks_for_cuda_activities_and_takes_the_device_spans(monkeypatch):
    """The CUDA branch, with the profiler faked: CUDA activities are asked for, only device-side events count as
    busy time (a CPU op's span does not), and the stall share is the rest of the step's wall time."""
    from torch.profiler import ProfilerActivity

    asked = {}
    kernels = [(0.0, 2000.0), (1000.0, 3000.0), (10000.0, 11000.0)]  # 4 ms busy over the 2 steps
    events = [
        SimpleNamespace(device_type=DeviceType.CUDA, time_range=SimpleNamespace(start=a, end=b)) for a, b in kernels
    ]
    events.append(SimpleNamespace(device_type=DeviceType.CPU, time_range=SimpleNamespace(start=0.0, end=1e6)))

    class FakeProfile:
        def __init__(self, activities):
            asked["activities"] = activities

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return SimpleNamespace(table=lambda sort_by, row_limit: asked.setdefault("sorted_by", []).append(sort_by))

        def events(self):
            return events

    monkeypatch.setattr("torch.profiler.profile", FakeProfile)
    monkeypatch.setattr(bench, "sync", lambda device: None)
    out = bench.profile_steps(lambda batches: time.sleep(0.01), [0, 1], torch.device("cuda"), 5)
    assert asked["activities"] == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    assert asked["sorted_by"] == ["self_cpu_time_total", "self_device_time_total"]
    assert out["device_busy_ms_per_step"] == pytest.approx(2.0)
    assert out["wall_ms_per_step"] >= 10
    assert out["stall_share"] == pytest.approx(1 - 2.0 / out["wall_ms_per_step"], abs=2e-3)
