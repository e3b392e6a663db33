"""One GPU's whole story in at most 8 minutes, ending with ONE JSON line (run by scripts/gpu_check.sh).

    $ bash scripts/gpu_check.sh                       # PY=.venv/bin/python (made by make setup FBGEMM=cuda TORCH=system)
    $ bash .gpu/b/stage2.sh bash scripts/gpu_check.sh # a GPU machine without package access (../shared/gpu/prepare.sh)

Steps, in order, each under its own timeout (they add up to TOTAL_TIMEOUT_S, at most 480 s); a step that fails, times
out or runs out of memory is recorded in the JSON and the next one runs:

    gpu               nvidia-smi -L
    stack             torch, fbgemm_gpu and torchrec import, with CUDA
    gpu_tests         pytest -m gpu tests/scripts/test_gpu.py (passed / failed / skipped)
    synthetic_B       the synthetic default (python -m recsys.train) on the GPU at global batch B = 8192 (2 epochs,
                      the last logged window of the second, as the issue measured), 32768 and 131072 (1 epoch each,
                      its last window): samples/s per GPU; "best_large_batch" is the faster of the two large ones
    gowalla           +experiment=gowalla sharding.device=cuda trainer.pipeline=sparse_dist from the raw files
                      (RECSYS_GOWALLA_DIR, else ../shared/data/gowalla, else .gpu/b/gowalla): wall seconds, training
                      samples/s, the served ranker's test Recall@20 / NDCG@20 (results.json's headline)
    bench_train       scripts/bench_train.py --shape movielens --device cuda: its JSON (three ways)
    bench_eval        scripts/bench_eval.py --device cuda: its JSON (ratio_vs_matmul)
    bench_loss        scripts/bench_loss.py --batch 131072 --dim 64 --device cuda: its JSON ("absent" without it)
    bench_loader      scripts/bench_loader.py --shape gowalla --device cuda: its JSON ("absent" without it)

Every step's peak device memory is sampled with nvidia-smi (memory.used, MiB, every 250 ms) while it runs. Python
steps run with $PY (default .venv/bin/python); this script needs only the standard library. Work files go to
$GPU_CHECK_DIR (default /tmp/recsys_gpu_check); with $OUT set, the JSON, gowalla's results.json and one archive of
every step's log are copied there (three files: a machine that returns at most 8 files from $OUT takes them all).
Exit status 0 when every step that exists passed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOTAL_TIMEOUT_S = 470  # 8 minutes less 10 s for this script's own work
LARGE_BATCHES = (32768, 131072)
BENCH_TRAIN = ("--shape", "movielens", "--device", "cuda", "--rounds", "3", "--steps", "20", "--warmup", "10")
STACK = (
    "import torch, fbgemm_gpu, torchrec; assert torch.cuda.is_available(), 'torch sees no CUDA device'; "
    "print('torch', torch.__version__, 'cuda', torch.version.cuda, '| fbgemm', fbgemm_gpu.__version__, "
    "'| torchrec', torchrec.__version__, '|', torch.cuda.get_device_name())"
)


def gowalla_dir() -> Path | None:
    for candidate in (
        os.environ.get("RECSYS_GOWALLA_DIR"),
        ROOT.parent / "shared/data/gowalla",
        ROOT / ".gpu/b/gowalla",
    ):
        if candidate and (Path(candidate) / "train.txt").is_file():
            return Path(candidate).resolve()
    return None


def train_args(work: Path, name: str, *overrides: str) -> list[str]:
    return [
        "-m",
        "recsys.train",
        *overrides,
        "sharding.device=cuda",
        "trainer.pipeline=sparse_dist",
        "trainer.resume=none",  # a rerun trains again, never reports an earlier run's figures
        "trainer.progress_bar=false",
        f"data.root={work / 'data'}",
        f"run_name=gpu_check_{name}",
        f"hydra.run.dir={work / name}",
    ]


def synthetic(work: Path, batch: int) -> list[str]:
    steps_per_epoch = 800_000 // batch  # the synthetic default: 1M interactions, 8:1:1
    epochs = 2 if batch == 8192 else 1
    return train_args(
        work,
        f"synthetic_{batch}",
        f"trainer.global_batch_size={batch}",
        f"trainer.epochs={epochs}",
        "trainer.early_stopping_patience=0",
        f"trainer.log_every_steps={max(2, min(20, steps_per_epoch // 5))}",  # a few windows an epoch
    )


def steps(work: Path) -> list[tuple[str, int, list[str] | None]]:
    """(name, timeout in seconds, argv after $PY, or a full argv for nvidia-smi; None: the script is absent)."""

    def script(path: str, *args: str) -> list[str] | None:
        return [path, *args] if (ROOT / path).is_file() else None

    return [
        ("gpu", 5, ["nvidia-smi", "-L"]),
        ("stack", 25, ["-c", STACK]),
        ("gpu_tests", 140, ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-m", "gpu", "tests/scripts/test_gpu.py"]),
        ("synthetic_8192", 45, synthetic(work, 8192)),
        *((f"synthetic_{b}", 30, synthetic(work, b)) for b in LARGE_BATCHES),
        ("gowalla", 90, train_args(work, "gowalla", "+experiment=gowalla")),
        ("bench_train", 40, script("scripts/bench_train.py", *BENCH_TRAIN)),
        ("bench_eval", 25, script("scripts/bench_eval.py", "--device", "cuda")),
        ("bench_loss", 20, script("scripts/bench_loss.py", "--batch", "131072", "--dim", "64", "--device", "cuda")),
        ("bench_loader", 20, script("scripts/bench_loader.py", "--shape", "gowalla", "--device", "cuda")),
    ]


def run_step(argv: list[str], timeout: int, log: Path, env: dict) -> tuple[int | None, float, int | None]:
    """(exit status or None on timeout, seconds, peak device MiB seen by nvidia-smi while it ran)."""
    sampler = None
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "250"]
        with log.with_suffix(".mem").open("w") as samples:
            sampler = subprocess.Popen(query, stdout=samples, stderr=subprocess.DEVNULL)
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as e:  # no such program (no nvidia-smi, a PY that does not exist)
            out.write(f"gpu_check: cannot run {argv[0]}: {e}\n")
            proc = None
        try:
            rc = proc.wait(timeout=timeout) if proc is not None else 127
        except subprocess.TimeoutExpired:
            try:
                os.killpg(
                    proc.pid, signal.SIGKILL
                )  # the step and whatever it started (torchrun workers, pytest's runs)
            except ProcessLookupError:  # it ended just now
                pass
            proc.wait()
            rc = None
    seconds = time.perf_counter() - start
    peak = None
    if sampler is not None:
        sampler.terminate()
        sampler.wait()
        values = [int(v) for v in re.findall(r"^\s*(\d+)\s*$", log.with_suffix(".mem").read_text(), re.M)]
        peak = max(values) if values else None
    return rc, seconds, peak


def last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def failure(text: str) -> str:
    """The line that says why a step failed: out of memory first, else the last error-like line, else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (r"out of memory", r"Error|error:|FAILED|Traceback"):
        hits = [line for line in lines if re.search(pattern, line)]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else ""


def gpu_test_counts(text: str) -> dict:
    """pytest's closing counts, or (a run cut short) the per-test PASSED / FAILED / SKIPPED lines of -v."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    closing = re.findall(r"(\d+) (passed|failed|skipped|errors?)", text.splitlines()[-1] if text.strip() else "")
    if closing:
        for n, kind in closing:
            counts["errors" if kind.startswith("error") else kind] = int(n)
        return counts
    for kind in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
        counts["errors" if kind == "ERROR" else kind.lower()] = len(re.findall(rf"::\S+ {kind}", text))
    return counts


def window_samples_per_s(run_dir: Path) -> float | None:
    """The last logged window's samples/s of the run's last epoch (metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if '"samples_per_s"' in line]
    return round(rows[-1]["samples_per_s"]) if rows else None


def gowalla_figures(run_dir: Path) -> dict:
    path = run_dir / "results.json"
    if not path.is_file():
        return {}
    results = json.loads(path.read_text())
    headline, train = results.get("headline", {}), results.get("train", {})
    test = headline.get("test", {})
    return {
        "train_samples_per_s": round(train["samples_per_s"]) if "samples_per_s" in train else None,
        "train_seconds": round(train["seconds"], 1) if "seconds" in train else None,
        "served": headline.get("ranker"),
        "test_recall@20": test.get("recall@20"),
        "test_ndcg@20": test.get("ndcg@20"),
    }


def figures(name: str, text: str, work: Path) -> dict:
    """What a step's output says, beyond its status."""
    if name == "stack":
        return {"versions": text.strip().splitlines()[-1] if text.strip() else ""}
    if name == "gpu":
        return {"device": text.strip().splitlines()[0] if text.strip() else ""}
    if name == "gpu_tests":
        return gpu_test_counts(text)
    if name.startswith("synthetic_"):
        return {"samples_per_s": window_samples_per_s(work / name)}
    if name == "gowalla":
        return gowalla_figures(work / name)
    return {"json": last_json(text)}


def main() -> int:
    work = Path(os.environ.get("GPU_CHECK_DIR", "/tmp/recsys_gpu_check"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    py = os.environ.get("PY", str(ROOT / ".venv/bin/python"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if (gowalla := gowalla_dir()) is not None:
        env["RECSYS_GOWALLA_DIR"] = str(gowalla)
    plan = steps(work)
    total = sum(timeout for _, timeout, _ in plan)
    assert total <= 480, f"the steps' timeouts add up to {total} s"
    report: dict = {"total_timeout_s": total, "steps": {}}
    start = time.perf_counter()
    for name, timeout, argv in plan:
        entry: dict = {"timeout_s": timeout}
        report["steps"][name] = entry
        if argv is None:
            entry["status"] = "absent"
        elif name == "gowalla" and gowalla is None:
            entry["status"] = "absent"
            entry["error"] = "no Gowalla files: set RECSYS_GOWALLA_DIR or copy them to .gpu/b/gowalla"
        elif name not in ("gpu", "stack") and report["steps"]["stack"]["status"] != "ok":
            entry["status"] = "skipped"  # every later step imports the stack
        else:
            log = work / f"{name}.log"
            rc, seconds, peak = run_step(argv if name == "gpu" else [py, *argv], timeout, log, env)
            text = log.read_text(errors="replace")
            entry.update(status="ok" if rc == 0 else "timeout" if rc is None else "failed", rc=rc)
            entry.update(seconds=round(seconds, 1), peak_gpu_mib=peak, **figures(name, text, work))
            if rc != 0:
                entry["error"] = failure(text) if rc is not None else f"killed after {timeout} s"
        print(f"gpu_check: {name}: {entry['status']}" + (f" in {entry['seconds']} s" if "seconds" in entry else ""))
    report["wall_s"] = round(time.perf_counter() - start, 1)
    summarize(report)
    line = json.dumps(report, separators=(",", ":"))
    (work / "gpu_check.json").write_text(line + "\n")
    copy_out(work)
    print(line, flush=True)
    return 0 if all(e["status"] in ("ok", "absent") for e in report["steps"].values()) else 1


def summarize(report: dict) -> None:
    """The headline figures beside the steps: samples/s by batch, the best large batch, the peak device memory."""
    s = report["steps"]
    by_batch = {b: s[f"synthetic_{b}"].get("samples_per_s") for b in (8192, *LARGE_BATCHES)}
    report["synthetic_samples_per_s"] = {str(b): v for b, v in by_batch.items()}
    large = [(v, b) for b, v in by_batch.items() if b in LARGE_BATCHES and v]
    report["best_large_batch"] = {"batch": max(large)[1], "samples_per_s": max(large)[0]} if large else None
    peaks = [e["peak_gpu_mib"] for e in s.values() if e.get("peak_gpu_mib")]
    report["peak_gpu_mib"] = max(peaks) if peaks else None
    eval_json = s["bench_eval"].get("json") or {}
    report["bench_eval_ratio"] = eval_json.get("ratio_vs_matmul")


def copy_out(work: Path) -> None:
    out = os.environ.get("OUT")
    if not out or Path(out).resolve() == work.resolve():
        return
    Path(out).mkdir(parents=True, exist_ok=True)
    with tarfile.open(Path(out) / "gpu_check_logs.tar.gz", "w:gz") as tar:
        for path in sorted(work.glob("*.log")) + sorted(work.glob("*/train.log")):
            tar.add(path, arcname=str(path.relative_to(work)))
    shutil.copy(work / "gpu_check.json", out)
    if (work / "gowalla" / "results.json").is_file():
        shutil.copy(work / "gowalla" / "results.json", Path(out) / "gowalla_results.json")


if __name__ == "__main__":
    sys.exit(main())
