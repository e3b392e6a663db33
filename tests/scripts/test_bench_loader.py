"""scripts/bench_loader.py on CPU: both loaders of a configured run timed side by side, its JSON figures."""

from tests.helpers.scripts import load_script

bench = load_script("bench_loader")


def test_bench_loader_times_both_loaders_of_a_configured_run(data_root):
    out = bench.main(
        ["--shape", "movielens", "--batches", "3", "--rounds", "2", "+experiment=tiny", f"data.root={data_root}"]
    )
    assert out["global_batch_size"] == 256 and out["device"] == "cpu"
    assert out["samples_per_s"] > 0 and out["host_samples_per_s"] > 0 and out["batches_per_s"] > 0
    assert out["ratio_vs_host"] > 0


def test_the_two_loaders_are_the_runs_device_and_host_loaders(data_root):
    import torch

    loaders = bench.configured_loaders(["+experiment=tiny", f"data.root={data_root}"], torch.device("cpu"))
    assert loaders["device"].device == torch.device("cpu") and loaders["host"].device is None
    assert not loaders["device"].builder.validate and loaders["host"].builder.validate
