"""The plain Trainer preempted: with an output_dir, a SIGTERM is a checkpoint
and exit status 75, and the resumed run ends with the uninterrupted run's
weights and metrics.json rows (as tools/train_net.py's jobs do)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.trainer import preemption_job as job
from treadle.trainer import Trainer
from treadle.hooks import PREEMPTED_EXIT_CODE, CallbackHook, PreemptionHandler

REPO = Path(__file__).resolve().parents[2]


def rows(run: Path) -> list:
    """metrics.json's rows without the timings, which differ from run to run."""
    lines = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("time", "data_time", "eta_seconds")} for row in lines]


def final_weights(run: Path) -> dict:
    return torch.load(run / "model_final.pth", weights_only=True)["model"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted run, checked against a hand-written PyTorch loop."""
    out = tmp_path_factory.mktemp("straight")
    job.trainer(str(out)).train()
    model = job.model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(job.MAX_ITER // len(job.data())):
        for x, y in job.data():
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    weights = final_weights(out)
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    return out


def test_sigterm_at_a_checkpoint_iteration_saves_exits_75_and_resumes_to_the_same_rows_and_weights(straight, tmp_path):
    """Before: the signal killed the process (status -15), and the iterations
    since the last periodic checkpoint were lost."""
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, str(REPO / "tests" / "trainer" / "preemption_job.py"), str(run), "7"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == PREEMPTED_EXIT_CODE, done.stderr[-3000:]
    assert (run / "last_checkpoint").read_text() == "model_0000007.pth"
    assert not (run / "model_final.pth").exists()
    # The row of the checkpoint's iteration (7), which the resumed run, starting at 8, never writes.
    assert [row["iteration"] for row in rows(run)] == [2, 3, 5, 7]
    resumed = job.trainer(str(run))
    resumed.train(resume=True)
    assert resumed.start_iter == 8
    assert rows(run) == rows(straight)
    assert all(torch.equal(final_weights(run)[k], v) for k, v in final_weights(straight).items())


def test_a_users_preemption_handler_keeps_the_row_of_a_checkpoint_iteration(straight, tmp_path):
    """hooks=[PreemptionHandler()] is the run's handler, in the default one's
    place. Before, it came before the periodic checkpointer, and a SIGTERM at
    a checkpoint iteration lost that iteration's row for good."""
    run = tmp_path / "run"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        preempted = job.trainer(str(run), [PreemptionHandler(), job.sigterm_at(7)])
        with pytest.raises(SystemExit) as exit_:
            preempted.train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exit_.value.code == PREEMPTED_EXIT_CODE
    assert sum(isinstance(h, PreemptionHandler) for h in preempted.hooks) == 1
    assert (run / "last_checkpoint").read_text() == "model_0000007.pth"
    job.trainer(str(run)).train(resume=True)
    assert rows(run) == rows(straight)
    assert all(torch.equal(final_weights(run)[k], v) for k, v in final_weights(straight).items())


def test_preemption_false_or_no_output_dir_installs_no_handler(tmp_path):
    def handlers(trainer):
        return [type(h).__name__ for h in trainer.hooks if isinstance(h, PreemptionHandler)]

    assert handlers(job.trainer(str(tmp_path / "a"))) == ["PreemptionHandler"]
    assert handlers(job.trainer(str(tmp_path / "b"), preemption=False)) == []
    model = job.model()
    without_a_folder = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), job.data(),
                               loss_fn=nn.functional.cross_entropy, max_iter=2)
    assert handlers(without_a_folder) == []


def _requeue_check() -> str:
    """The line of docs/distributed.md's requeue loop that tells a preemption from the run's folder."""
    page = (REPO / "docs" / "distributed.md").read_text()
    loop = page[page.index("**A requeue loop**"):page.index("**What torchrun returns.**")]
    return next(line.strip() for line in loop.splitlines() if "summary.json" in line and "grep" in line)


def _says(check: str, out: Path) -> str:
    done = subprocess.run(["bash", "-c", check], env=dict(os.environ, OUT=str(out)), capture_output=True, text=True,
                          timeout=60)
    return done.stdout.strip()


def test_the_requeue_loops_check_tells_a_preempted_run_from_a_finished_or_failed_one(straight, tmp_path):
    """torchrun exits 1 after a preemption too: docs/distributed.md's loop tells it by the run's folder."""
    check = _requeue_check()
    run, failed = tmp_path / "run", tmp_path / "failed"
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_:
            job.trainer(str(run), [job.sigterm_at(5)]).train()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert exit_.value.code == PREEMPTED_EXIT_CODE
    with pytest.raises(ZeroDivisionError):
        job.trainer(str(failed), [CallbackHook(after_step=lambda t: t.iter == 5 and 1 / 0)]).train()
    assert _says(check, run) == "preempted: requeued"
    assert _says(check, straight) == _says(check, failed) == _says(check, tmp_path / "never_started") == ""


@pytest.mark.slow
def test_under_torchrun_a_preempted_run_exits_1_and_its_folder_says_interrupted(tmp_path):
    """What docs/distributed.md says torchrun returns (torch 2.13): a SIGTERM to
    torchrun reaches both workers, which checkpoint and exit 75; torchrun itself
    exits 1, with its own SignalException."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(REPO / "tests" / "trainer" / "preemption_job.py"), str(run), "5", "agent"],
        cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "SignalException: Process" in done.stderr and "got signal: 15" in done.stderr
    assert "Exiting with status 75 after preemption." in (run / "log.txt").read_text()
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"
    assert (run / "last_checkpoint").read_text() == "model_0000011.pth"
    assert _says(_requeue_check(), run) == "preempted: requeued"
