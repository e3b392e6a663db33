"""scripts/bench_ials.py: the stage's default iALS grid on a synthetic matrix (the script's figures, at a tiny size)."""

from tests.helpers.scripts import load_script

load_script("synthetic_matrix")  # the script imports it from scripts/, as a run by path finds it
bench = load_script("bench_ials")


def test_the_benchmark_runs_the_stages_default_grid(capsys):
    recalls = bench.main(["--num-users", "300", "--num-items", "120", "--nnz", "4000", "--max-users", "100"])
    assert list(recalls) == [(r, a) for r in (0.1, 1.0, 10.0) for a in (3.0, 10.0, 30.0)]  # IalsSettings' grid
    assert all(0.0 < r <= 1.0 for r in recalls.values())
    out = capsys.readouterr().out
    assert "grid of 9 in" in out and "on 100 valid users" in out
