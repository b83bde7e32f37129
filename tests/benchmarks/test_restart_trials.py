"""benchmarks/restart_trials.py at its smallest: one trial per system, its table read back."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Four torchrun jobs with a restart each: a minute or two.
pytestmark = pytest.mark.slow


def test_restart_trials_prints_a_row_per_system_and_treadle_ends_exact(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "restart_trials.py"), "--trials", "1", "--moments", "save-file",
         "--max-iter", "40", "--bound", "150", "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=True,
    ).stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()[:1] and line.split()[0] in
            ("treadle", "plain-torch", "plain+treadle", "save-file")}
    assert set(rows) == {"treadle", "plain-torch", "plain+treadle", "save-file"}, out
    # trials, exact, inexact, failed, hung
    assert rows["treadle"] == ["1", "1", "0", "0", "0"], out
    assert rows["save-file"] == ["1", "1", "0", "0", "0"], out
    assert rows["plain+treadle"] == ["1", "1", "0", "0", "0"], out
    # torch's own set-up: any outcome, but one trial counted.
    assert rows["plain-torch"][0] == "1" and sum(map(int, rows["plain-torch"][1:])) == 1, out
    assert (tmp_path / "treadle-000.killed").exists()
