"""`make setup`: pip's one expected complaint (torchrec's fbgemm-gpu, satisfied by fbgemm-gpu-cpu) never prints."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list:
    # -n: print the recipe without running it; -B: as on a fresh clone (no stamp yet)
    out = subprocess.run(
        ["make", "-n", "-B", "setup", f"VENV={sys.prefix}"], cwd=ROOT, capture_output=True, text=True, check=True
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
