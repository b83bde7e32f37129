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
from treadle.engine import Trainer
from treadle.hooks import PREEMPTED_EXIT_CODE, PreemptionHandler

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
