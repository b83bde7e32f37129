"""Runs a research example (``treadle/examples/research/<name>.py``) the ways its tests need.

An example is a module with ``main(argv)`` taking ``--output-dir``,
``--max-iter``, ``--resume`` (and ``--num-gpus`` where it runs on several
processes), whose trainer saves ``model_final.pth`` and writes
``metrics.json`` there. The harness:

- :func:`run_here`: runs ``main`` in this process; returns the final
  checkpoint and the metrics rows (:class:`Run`);
- :func:`run_subprocess`: runs it as ``python -m <module>``, optionally
  SIGKILLed (``kill -9``) at the end of one iteration (on several processes:
  the launcher and its workers, the whole process group);
- :func:`kill_and_resume`: a run killed at an iteration, then ``--resume``
  to the end, beside an uninterrupted run: :func:`assert_same_run` checks
  every tensor of the final checkpoints ``torch.equal`` and the metrics rows
  equal (timings aside).

The kill is made by ``research_run.py``, which runs the example with a hook
that SIGKILLs its process group in ``after_step`` of iteration ``kill_at``
(after that iteration's rows were written; pick an iteration that is not a
checkpoint's, so that the resume goes back to the one before).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("research_run.py")
TIMEOUT = 180  # seconds for any one subprocess run; only reached when something hangs
#: metrics.json keys that are timings, different in every run.
TIMINGS = {"time", "data_time", "eta_seconds", "iter_time"}


@dataclass
class Run:
    """What a run left: its final checkpoint (``None`` when killed) and metrics rows."""

    output_dir: Path
    state: Optional[Dict[str, Any]]
    rows: List[Dict[str, Any]]


def module_name(example: str) -> str:
    """``"gan"`` -> ``"treadle.examples.research.gan"``; a dotted name stays as it is."""
    return example if "." in example else f"treadle.examples.research.{example}"


def read_run(output_dir: Path) -> Run:
    final = output_dir / "model_final.pth"
    # weights_only=False: the trainer's state holds plain Python objects beside tensors.
    state = torch.load(final, map_location="cpu", weights_only=False) if final.exists() else None
    metrics = output_dir / "metrics.json"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return Run(output_dir, state, rows)


def run_here(example: str, output_dir: Path, max_iter: int, *args: str) -> Run:
    """Runs ``main`` of the example in this process (one process); restores
    what the example changes of this process (the thread count, torch's RNG)."""
    module = importlib.import_module(module_name(example))
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        module.main(["--output-dir", str(output_dir), "--max-iter", str(max_iter), *args])
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
    return read_run(output_dir)


def _env(kill_at: Optional[int]) -> Dict[str, str]:
    # No inherited torchrun variables: each run sets up its own process group.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RESEARCH_KILL_AT", None)
    if kill_at is not None:
        env["RESEARCH_KILL_AT"] = str(kill_at)
    return env


def run_subprocess(example: str, output_dir: Path, max_iter: int, *args: str, kill_at: Optional[int] = None,
                   resume: bool = False, num_gpus: int = 1) -> Run:
    """Runs the example in a subprocess of its own process group; with
    ``kill_at``, expects it SIGKILLed at the end of that iteration."""
    cmd = [sys.executable, str(RUNNER), module_name(example), "--output-dir", str(output_dir),
           "--max-iter", str(max_iter), *args]
    cmd += ["--resume"] if resume else []
    cmd += ["--num-gpus", str(num_gpus)] if num_gpus != 1 else []
    log = output_dir.parent / f"{output_dir.name}-{'killed' if kill_at is not None else 'run'}{'-resumed' if resume else ''}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(kill_at), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{' '.join(cmd)} did not end in {TIMEOUT} s:\n{log.read_text(errors='replace')[-3000:]}")
    expected = -signal.SIGKILL if kill_at is not None else 0
    if rc != expected:
        pytest.fail(f"{' '.join(cmd)} exited with {rc}, expected {expected}:\n{log.read_text(errors='replace')[-3000:]}")
    return read_run(output_dir)


def kill_and_resume(example: str, tmp_path: Path, max_iter: int, kill_at: int, *args: str,
                    num_gpus: int = 1, reference: Optional[Run] = None) -> Run:
    """An uninterrupted run (unless ``reference`` is given), a run killed with
    SIGKILL at ``kill_at`` then resumed to ``max_iter``: asserts both equal
    (:func:`assert_same_run`) and returns the resumed run."""
    if reference is None:
        reference = run_subprocess(example, tmp_path / "uninterrupted", max_iter, *args, num_gpus=num_gpus)
    run_dir = tmp_path / "killed"
    killed = run_subprocess(example, run_dir, max_iter, *args, kill_at=kill_at, num_gpus=num_gpus)
    assert killed.state is None, "the killed run wrote a final checkpoint"
    assert [row["iteration"] for row in killed.rows][-1] == kill_at, "the kill did not land at its iteration"
    resumed = run_subprocess(example, run_dir, max_iter, *args, resume=True, num_gpus=num_gpus)
    assert_same_run(resumed, reference)
    return resumed


def assert_equal_tree(a: Any, b: Any, where: str = "") -> None:
    """Every tensor ``torch.equal`` (dtype and shape included), every other
    value ``==``, nested dicts, lists and tuples alike."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: a tensor and a {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"{where}: tensors differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)} != {list(b) if isinstance(b, dict) else b}"
        for key in a:
            assert_equal_tree(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def without_timings(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in rows]


def checkpoint_tensors(state: Dict[str, Any]) -> Dict[str, Any]:
    """The final checkpoint without what differs between any two runs (the
    lineage of periodic files a resumed run keeps; the storage's timings)."""
    state = dict(state)
    trainer = dict(state["trainer"])
    trainer["hooks"] = {k: v for k, v in trainer["hooks"].items() if k != "PeriodicCheckpointer"}
    if "storage" in trainer:  # the scalars' histories: equal, but for timings
        trainer["storage"] = {k: v for k, v in trainer["storage"].items() if k not in TIMINGS}
    state["trainer"] = trainer
    return state


def assert_same_run(run: Run, reference: Run) -> None:
    """Bit-exact: every tensor and value of the final checkpoints (models,
    optimizers, schedules, the step's data position and state, the RNG), and
    the same metrics rows, each iteration once."""
    assert run.state is not None and reference.state is not None, "a run has no final checkpoint"
    assert_equal_tree(checkpoint_tensors(run.state), checkpoint_tensors(reference.state), "checkpoint")
    assert [row["iteration"] for row in run.rows] == [row["iteration"] for row in reference.rows]
    assert without_timings(run.rows) == without_timings(reference.rows)


def final_weights(run: Run, key: str = "model") -> Dict[str, torch.Tensor]:
    """A model's weights from the final checkpoint (``key``: its checkpointable's name)."""
    assert run.state is not None, f"{run.output_dir} has no final checkpoint"
    return run.state[key]


def assert_weights_equal(weights: Dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Each tensor of ``weights`` ``torch.equal`` to the same-named one of ``model`` (a hand loop's)."""
    state = model.state_dict()
    assert list(weights) == list(state)
    for name, value in state.items():
        assert torch.equal(weights[name], value), f"{name} differs from the hand-written loop's"
