"""scripts/gpu_check.sh's logic, with stand-ins for nvidia-smi and the GPU machine's python (no GPU, no training).

What the next GPU machine relies on: every step runs under its own timeout (adding up to at most 8 minutes), a step
that fails, hangs or runs out of memory is recorded and the next one runs, and the last line is one JSON object.
"""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the GPU machine's python, answering each step the way a run there would (the 131072 batch: out of memory)
FAKE_PY = r"""
import json, sys
from pathlib import Path
args = sys.argv[1:]
def override(key):
    return next((a.split("=", 1)[1] for a in args if a.startswith(key + "=")), None)
if args[0] == "-c":
    print("torch 2.11.0+cu130 cuda 13.0 | fbgemm 1.6.0 | torchrec 1.6.1 | NVIDIA H200")
elif args[:2] == ["-m", "pytest"]:
    print("tests/scripts/test_gpu.py::test_cuda_matches_cpu_curve PASSED [ 50%]")
    print("============ 6 passed, 1 skipped in 91.20s (0:01:31) ============")
elif args[:2] == ["-m", "recsys.train"]:
    run_dir, batch = Path(override("hydra.run.dir")), int(override("trainer.global_batch_size") or 1024)
    if batch == 131072:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB", file=sys.stderr)
        sys.exit(1)
    run_dir.mkdir(parents=True)
    rows = [{"step": 20, "epoch": 0, "samples_per_s": 1.0}, {"step": 40, "epoch": 1, "samples_per_s": batch * 10.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if "+experiment=gowalla" in args:
        test = {"two_tower+graph_filter": {"recall@20": 0.193, "ndcg@20": 0.1603}}
        results = {"test": test, "headline": {"ranker": "two_tower+graph_filter", "test": test["two_tower+graph_filter"]},
                   "train": {"samples_per_s": 116000.0, "seconds": 25.2}}
        (run_dir / "results.json").write_text(json.dumps(results))
else:
    print("timing...")
    print(json.dumps({"script": Path(args[0]).name, "ratio_vs_matmul": 1.8}))
"""


def fake_machine(tmp_path: Path, py_source: str, smi_list: str = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"') -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nif [ "$1" = "-L" ]; then {smi_list}; else echo 40000; echo 71234; fi\n')
    py = tmp_path / "python"
    py.write_text(f"#!{sys.executable}\n{py_source}")
    gowalla = tmp_path / "gowalla"
    gowalla.mkdir()
    (gowalla / "train.txt").write_text("0 1 2\n")
    for path in (smi, py):
        path.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PY": str(py),
        "GPU_CHECK_DIR": str(tmp_path / "work"),
        "OUT": str(tmp_path / "out"),
        "RECSYS_GOWALLA_DIR": str(gowalla),
    }


def run_check(env: dict) -> tuple[int, dict]:
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    last = proc.stdout.strip().splitlines()[-1]
    return proc.returncode, json.loads(last)


def test_every_step_is_recorded_and_the_figures_read_from_each_run(tmp_path):
    rc, report = run_check(fake_machine(tmp_path, FAKE_PY))
    steps = report["steps"]
    assert rc == 1  # the out-of-memory step failed; every other step ran on after it
    assert steps["synthetic_131072"]["status"] == "failed"
    assert "CUDA out of memory" in steps["synthetic_131072"]["error"]
    expected_ok = [
        "gpu",
        "stack",
        "gpu_tests",
        "synthetic_8192",
        "synthetic_32768",
        "gowalla",
        "bench_train",
        "bench_eval",
    ]
    assert [n for n in expected_ok if steps[n]["status"] != "ok"] == []
    for lead_bench in ("bench_loss", "bench_loader"):  # the lead's scripts: run where they exist
        exists = (ROOT / "scripts" / f"{lead_bench}.py").is_file()
        assert steps[lead_bench]["status"] == ("ok" if exists else "absent")
    assert report["total_timeout_s"] == sum(s["timeout_s"] for s in steps.values()) <= 480
    assert steps["gpu_tests"]["passed"] == 6 and steps["gpu_tests"]["skipped"] == 1
    assert steps["stack"]["versions"].startswith("torch 2.11.0+cu130")
    assert report["synthetic_samples_per_s"] == {"8192": 81920, "32768": 327680, "131072": None}
    assert report["best_large_batch"] == {"batch": 32768, "samples_per_s": 327680}
    gowalla = steps["gowalla"]
    assert gowalla["served"] == "two_tower+graph_filter" and gowalla["test_recall@20"] == 0.193
    assert gowalla["test_ndcg@20"] == 0.1603 and gowalla["train_samples_per_s"] == 116000 and gowalla["seconds"] >= 0
    assert steps["bench_train"]["json"]["script"] == "bench_train.py" and report["bench_eval_ratio"] == 1.8
    assert report["peak_gpu_mib"] == 71234 and steps["bench_eval"]["peak_gpu_mib"] == 71234
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gowalla_results.json", "gpu_check.json", "gpu_check_logs.tar.gz"]
    assert json.loads((out / "gpu_check.json").read_text()) == report
    with tarfile.open(out / "gpu_check_logs.tar.gz") as tar:
        assert {"gpu_tests.log", "synthetic_131072.log", "gowalla.log"} <= set(tar.getnames())


def test_a_hung_step_is_killed_at_its_timeout_and_a_broken_stack_skips_the_rest(tmp_path):
    """nvidia-smi -L hangs (killed after its 5 s); the python cannot import the stack: the steps that need it are
    skipped, and the JSON line still ends the output."""
    env = fake_machine(tmp_path, "import sys; print('ModuleNotFoundError: fbgemm_gpu'); sys.exit(1)", "sleep 60")
    rc, report = run_check(env)
    steps = report["steps"]
    assert rc == 1
    assert steps["gpu"]["status"] == "timeout" and steps["gpu"]["seconds"] < 15
    assert steps["stack"]["status"] == "failed" and "fbgemm_gpu" in steps["stack"]["error"]
    later = [n for n in steps if n not in ("gpu", "stack")]
    assert {steps[n]["status"] for n in later} <= {"skipped", "absent"}
    assert report["total_timeout_s"] <= 480 and report["wall_s"] < 30


def test_every_training_step_is_a_valid_config_and_every_bench_takes_its_arguments(tmp_path):
    """A typo in an override would cost the GPU machine's minutes: each recsys.train step's overrides compose into a
    config (the batch, epochs and device it means), and bench_train / bench_eval parse theirs."""
    from hydra import compose, initialize_config_dir

    from recsys.config import register_configs, to_config
    from tests.helpers.scripts import load_script

    check = load_script("gpu_check")
    plan = {name: argv for name, _, argv in check.steps(tmp_path)}
    register_configs()
    for name in ("synthetic_8192", "synthetic_32768", "synthetic_131072", "gowalla"):
        overrides = [a for a in plan[name][2:] if not a.startswith("hydra.")]
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = to_config(compose(config_name="config", overrides=overrides))
        assert cfg.sharding.device == "cuda" and cfg.trainer.pipeline == "sparse_dist" and cfg.trainer.resume == "none"
        if name == "gowalla":
            assert cfg.data.name == "gowalla" and cfg.trainer.global_batch_size == 2048  # the experiment's
        else:
            batch = int(name.split("_")[1])
            assert cfg.data.name == "synthetic" and cfg.trainer.global_batch_size == batch
            assert cfg.trainer.epochs == (2 if batch == 8192 else 1)
            assert 800_000 // batch // cfg.trainer.log_every_steps >= 2  # at least two windows an epoch
    for bench in ("bench_train", "bench_eval"):
        assert plan[bench][0] == f"scripts/{bench}.py"
        assert load_script(bench).parse_args(plan[bench][1:]).device == "cuda"
