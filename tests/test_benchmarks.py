"""The benchmarks still run: each is started with the smallest settings and
its report read back (the figures themselves are not asserted)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_overhead_benchmark_prints_every_section():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--rounds", "2", "--iters", "20", "--no-compile", "--breakdown"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for expected in ("~1 ms", "~0.2 ms", "paired", "fastest", "without the JSON and console writers", "PeriodicWriter.after_step", "+ LRScheduler", "the torch operations alone"):
        assert expected in out, f"{expected!r} missing from:\n{out}"


def test_checkpoint_benchmark_prints_sync_and_async_figures():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "checkpoint.py"), "--sizes", "1", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    for expected in ("sync save s", "MiB/s", "first stall s", "stall/sync", "extra host MiB"):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert len([line for line in out.splitlines() if line.strip().endswith(tuple("0123456789"))]) == 1
