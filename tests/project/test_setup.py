"""`make setup`: pip's one expected complaint (torchrec's fbgemm-gpu, satisfied by fbgemm-gpu-cpu) never prints."""

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Run under `make test`, a child make inherits MAKELEVEL / MAKEFLAGS and prints "make[1]: Entering directory"
# on stdout: the recipe read here must be the one a user's own `make -n` prints.
MAKE_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}


def _setup_commands() -> list:
    # -n: print the recipe without running it; -B: as on a fresh clone (no stamp yet)
    out = subprocess.run(
        ["make", "-n", "-B", "setup", f"VENV={sys.prefix}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=MAKE_ENV,
    )
    return [line for line in out.stdout.splitlines() if not line.startswith("#")]  # the recipe's comments


def test_setup_prints_no_pip_error_yet_shows_other_conflicts():
    commands = _setup_commands()
    install = next(c for c in commands if "pip install" in c and "-e '.[test,docs]'" in c)
    assert "--no-warn-conflicts" in install  # pip's own check would print the expected conflict as an ERROR
    check = next(c for c in commands if "pip check" in c)
    raw = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True).stdout
    filtered = subprocess.run(["bash", "-c", check], cwd=ROOT, capture_output=True, text=True)
    assert filtered.returncode == 0 and filtered.stdout == "", filtered.stdout
    try:
        importlib.metadata.version("fbgemm-gpu")
    except importlib.metadata.PackageNotFoundError:  # CPU install: the filtered line is really pip's message
        assert re.search(r"^torchrec [0-9.]+ requires fbgemm-gpu, which is not installed", raw, re.M), raw
    # any other broken requirement still shows
    pattern = re.search(r"-e '([^']+)'", check).group(1)
    assert re.search(pattern, "torchrec 1.8.0 requires fbgemm-gpu, which is not installed.")
    assert not re.search(pattern, "tensordict 0.15.3 requires torch, which is not installed.")


def _fake_python(tmp_path: Path, version: str | None) -> Path:
    """A stand-in for the machine's python: it answers the Makefile's torch-version question with ``version``
    (None: no torch to import). Nothing is installed: the Makefile is only read (make -n)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + (f"echo {version}\n" if version else "exit 1\n"))
    path.chmod(0o755)
    return path


def _make_n(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "-B", "setup", *args], cwd=ROOT, capture_output=True, text=True, env=MAKE_ENV)


@pytest.mark.parametrize(
    "version, fbgemm, torchrec",
    [("2.11.0+cu130", "1.6.0", "1.6.1"), ("2.12.1", "1.7.0", "1.7.0"), ("2.13.0a0+gitf2d1", "1.8.0", "1.8.0")],
)
def test_system_torch_is_kept_and_gets_the_fbgemm_and_torchrec_built_for_it(tmp_path, version, fbgemm, torchrec):
    python, venv = _fake_python(tmp_path, version), tmp_path / "venv"
    out = _make_n("TORCH=system", "FBGEMM=cuda", f"PYTHON={python}", f"VENV={venv}")
    assert out.returncode == 0, out.stderr
    commands = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert commands[0] == f"test -x {venv}/bin/python || {python} -m venv --system-site-packages {venv}"
    assert f"echo 'torch=={version}' > {venv}/torch-constraint.txt" in commands
    installs = [c for c in commands if " -m pip install " in c and "--upgrade pip" not in c]
    assert not any("torch==" in c for c in installs)  # the machine's torch stays
    assert (
        [c for c in installs if "fbgemm-gpu" in c][0]
        .rstrip()
        .endswith(f"-c {venv}/torch-constraint.txt fbgemm-gpu=={fbgemm}")
    )
    assert any(c.endswith(f"--no-deps torchrec=={torchrec}") for c in installs)
    assert f"-c {venv}/torch-constraint.txt -e '.[test,docs]'" in [c for c in installs if "-e '" in c][0]
    uninstall = next(c for c in commands if "pip uninstall" in c)
    assert uninstall.split("-y ")[1].startswith("fbgemm-gpu fbgemm-gpu-cpu &&")  # never the machine's torch


@pytest.mark.parametrize("version", ["2.10.0", "3.0.1+cu130", None])
def test_a_system_torch_not_in_the_table_is_refused_in_one_line(tmp_path, version):
    out = _make_n("TORCH=system", "FBGEMM=cuda", f"PYTHON={_fake_python(tmp_path, version)}")
    assert out.returncode != 0 and out.stdout == ""
    (line,) = [line for line in out.stderr.splitlines() if line.strip()]
    assert (f"torch {version} " if version else "imports no torch") in line
    for row in ("2.11 -> fbgemm-gpu 1.6.0 + torchrec 1.6.1", "2.12 -> fbgemm-gpu 1.7.0 + torchrec 1.7.0"):
        assert f"torch {row}" in line
    assert "torch 2.13 -> fbgemm-gpu 1.8.0 + torchrec 1.8.0" in line


def test_default_setup_installs_the_pinned_stack_in_its_own_venv(tmp_path):
    out = _make_n("FBGEMM=cpu", f"VENV={tmp_path}")
    assert out.returncode == 0, out.stderr
    commands = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    assert commands[0] == f"test -x {tmp_path}/bin/python || python3 -m venv {tmp_path}"
    assert f"{tmp_path}/bin/python -m pip install --quiet --quiet torch==2.13.0 fbgemm-gpu-cpu==1.8.0 " in commands
    assert f"{tmp_path}/bin/python -m pip install --quiet --quiet --no-deps torchrec==1.8.0" in commands
    assert not any("constraint" in c or "system-site-packages" in c for c in commands)
    assert "uninstall --quiet -y torch fbgemm-gpu fbgemm-gpu-cpu" in next(c for c in commands if "pip uninstall" in c)
    refused = _make_n("TORCH=sys")
    assert refused.returncode != 0 and "TORCH=sys: expected pinned" in refused.stderr
