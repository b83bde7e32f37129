"""The plain ``Trainer`` on several processes, as its users start it.

One script (tests/dist_scripts/plain_trainer.py) runs as one process, under
``torchrun --nproc-per-node 2`` and through ``launch(main, 2)``, with the
same total batch and a shuffled order: the processes train one model, so
they end with the weights and the evaluation of the single process. Every
job runs under a timeout, so a hang fails its test.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from torch import nn

from treadle.trainer import Trainer
from treadle.trainer import data as trainer_data
from treadle.utils import comm

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "dist_scripts" / "plain_trainer.py")
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TIMEOUT = 180


def _run(out: Path, *args: str, launcher: List[str] = (), expect_rc: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    cmd = [sys.executable, *launcher, SCRIPT, str(out), *args]
    # Its own session: a --kill-at job SIGKILLs its process group, never pytest's.
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT, start_new_session=True)
    if expect_rc is not None and result.returncode != expect_rc:
        pytest.fail(f"{' '.join(cmd)} exited with {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def _weights(path: Path) -> Dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)
    return state.get("model", state)


def _result(out: Path) -> dict:
    return json.loads((Path(f"{out}-result") / "result.json").read_text())


def _metric_rows(out: Path) -> List[int]:
    return [json.loads(line)["iteration"] for line in (out / "metrics.json").read_text().splitlines()]


def _without_timings(rows: List[dict]) -> List[dict]:
    return [{k: v for k, v in row.items() if "time" not in k} for row in rows]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("plain_trainer")
    runs = {
        "one": ["--batch-size", "16"],
        "torchrun": ["--batch-size", "8"],
        "launch": ["--launch", "2", "--loader", "dataloader", "--batch-size", "8"],
    }
    for name, args in runs.items():
        _run(root / name, *args, launcher=TORCHRUN if name == "torchrun" else [])
    return {name: root / name for name in runs}


@pytest.mark.parametrize("job", ["torchrun", "launch"])
def test_two_processes_end_with_the_weights_and_evaluation_of_one(jobs, job):
    one, two = jobs["one"], jobs[job]
    rank0, rank1 = (_weights(Path(f"{two}-result") / f"rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(rank0[k], rank1[k]) for k in rank0), "the ranks' weights differ"
    alone = _weights(Path(f"{one}-result") / "rank0.pt")
    for key in alone:
        torch.testing.assert_close(rank0[key], alone[key], rtol=0, atol=1e-5)
    # 37 evaluation samples shared 19/18: each counts once, as on one process.
    expected, got = _result(one), _result(two)
    assert got["evaluate"]["accuracy"] == expected["evaluate"]["accuracy"]
    assert got["evaluate"]["loss"] == pytest.approx(expected["evaluate"]["loss"], abs=1e-6)
    assert [row["accuracy"] for row in got["epochs"]] == [row["accuracy"] for row in expected["epochs"]]
    assert _metric_rows(two) == _metric_rows(one) == [1, 3, 5, 7, 9, 11, 13, 15, 17, 18]  # 18: the final evaluation


@pytest.mark.slow
def test_the_seeds_override_points_on_two_processes_end_as_one(jobs, tmp_path):
    """qurious' train_step, pytorch-accelerated's calculate_eval_batch_loss and an
    on_train_epoch_end callback, under torchrun: the weights and evaluation of one process."""
    _run(tmp_path / "one", "--batch-size", "16", "--overrides")
    _run(tmp_path / "two", "--batch-size", "8", "--overrides", launcher=TORCHRUN)
    alone, rank0 = (_weights(Path(f"{tmp_path / run}-result") / "rank0.pt") for run in ("one", "two"))
    assert all(torch.allclose(alone[k], rank0[k], atol=1e-6) for k in alone)
    assert all(torch.allclose(alone[k], v, atol=1e-6) for k, v in _weights(Path(f"{jobs['one']}-result") / "rank0.pt").items())
    one, two = _result(tmp_path / "one"), _result(tmp_path / "two")
    assert two["evaluate"] == pytest.approx(one["evaluate"], abs=1e-6)
    assert one["epoch_ends"] == two["epoch_ends"] == [5, 11, 17]


def test_only_the_main_process_writes_and_the_log_says_which_batch_size_applies(jobs):
    torchrun, launched = jobs["torchrun"], jobs["launch"]
    assert "Batches: batch_size=8 per process x 2 process(es) = 16 samples per step" in (torchrun / "log.txt").read_text()
    assert "The training DataLoader is sharded over 2 processes: batch_size=8 per process" in (launched / "log.txt").read_text()
    for out in (torchrun, launched):
        assert len(list(out.glob("events.out.tfevents.*"))) == 1
        assert sorted(p.name for p in out.glob("model_*.pth")) == [
            "model_0000007.pth", "model_0000011.pth", "model_0000015.pth", "model_final.pth",
        ]


def test_total_batch_size_and_kill_9_then_resume_on_two_processes_is_bit_identical(jobs, tmp_path):
    """``total_batch_size=16`` is the run of ``batch_size=8`` on 2 processes; the
    job SIGKILLed after iteration 10 (last checkpoint: 7) and resumed with
    ``resume=True`` on 2 processes ends bit-identical to the uninterrupted one."""
    run = tmp_path / "run"
    killed = _run(run, "--total-batch-size", "16", "--kill-at", "10", launcher=TORCHRUN, expect_rc=None)
    assert killed.returncode != 0
    assert (run / "last_checkpoint").read_text() == "model_0000007.pth"
    assert not (run / "model_final.pth").exists()
    _run(run, "--total-batch-size", "16", "--resume", launcher=TORCHRUN)
    log = (run / "log.txt").read_text()
    assert "Batches: total_batch_size=16 over 2 process(es) = 8 samples per process" in log
    uninterrupted = _weights(Path(f"{jobs['torchrun']}-result") / "rank0.pt")
    for rank in (0, 1):
        resumed = _weights(Path(f"{run}-result") / f"rank{rank}.pt")
        assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted), f"rank {rank} differs"
    assert _without_timings(_result(run)["epochs"]) == _without_timings(_result(jobs["torchrun"])["epochs"])
    iterations = _metric_rows(run)
    assert sorted(set(iterations)) == iterations  # each row once, in order, after the resume too
    assert iterations[-1] == 18


def test_a_worker_killed_under_torchrun_restarts_resumes_and_ends_exact(jobs, tmp_path):
    """``torchrun --max-restarts 3``: rank 1 SIGKILLed after iteration 10 of
    the first attempt; torchrun restarts the group, the script's
    ``train(resume=True)`` continues from iteration 7's checkpoint, and the
    run ends bit-identical to the uninterrupted one (the restarted group
    meets again: issue 36's set-up, which the Trainer uses)."""
    run = tmp_path / "run"
    result = _run(run, "--batch-size", "8", "--resume", "--kill-rank-at", "1:10", launcher=[*TORCHRUN, "--max-restarts", "3"])
    assert "Resuming from" in (run / "log.txt").read_text()
    uninterrupted = _weights(Path(f"{jobs['torchrun']}-result") / "rank0.pt")
    for rank in (0, 1):
        resumed = _weights(Path(f"{run}-result") / f"rank{rank}.pt")
        assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted), f"rank {rank} differs\n{result.stderr[-2000:]}"
    assert _metric_rows(run) == sorted(set(_metric_rows(run)))


@pytest.mark.slow
def test_fsdp_by_argument_trains_as_one_process(jobs, tmp_path):
    run = tmp_path / "fsdp"
    _run(run, "--launch", "2", "--batch-size", "8", "--ddp", "fsdp")
    sharded, alone = _weights(run / "model_final.pth"), _weights(jobs["one"] / "model_final.pth")
    assert list(sharded) == list(alone)
    for key in alone:
        torch.testing.assert_close(sharded[key], alone[key], rtol=0, atol=1e-5)
    assert _result(run)["evaluate"]["accuracy"] == _result(jobs["one"])["evaluate"]["accuracy"]


# ---------------------------------------------------------------- in this process
def _data(n: int = 32) -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.zeros(n, dtype=torch.long))


def test_batch_size_and_total_batch_size_together_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^batch_size=8 \(per process\) and total_batch_size=16 \(over all processes\) were both given: give one$"):
        Trainer(nn.Linear(1, 2), "sgd", _data(), lr=0.1, batch_size=8, total_batch_size=16, max_iter=1)


def test_total_batch_size_on_one_process_is_the_batch(treadle_caplog):
    with treadle_caplog.at_level(logging.INFO, logger="treadle.engine"):
        trainer = Trainer(nn.Linear(1, 2), "sgd", _data(), lr=0.1, total_batch_size=8, max_iter=1)
    assert trainer.train_loader.batch_size == 8
    assert "Batches: total_batch_size=8 over 1 process(es) = 8 samples per process" in treadle_caplog.text


def test_a_bad_wrapper_or_timeout_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="the model wrapper must be 'ddp' or 'fsdp', got 'zero3'"):
        Trainer(nn.Linear(1, 2), "sgd", _data(), lr=0.1, batch_size=8, max_iter=1, ddp="zero3")
    with pytest.raises(ValueError, match="ema_decay is not supported with ddp='fsdp'"):
        Trainer(nn.Linear(1, 2), "sgd", _data(), lr=0.1, batch_size=8, max_iter=1, ddp="fsdp", ema_decay=0.9)
    with pytest.raises(ValueError, match="dist_timeout must be a positive number of seconds, got 0"):
        Trainer(nn.Linear(1, 2), "sgd", _data(), lr=0.1, batch_size=8, max_iter=1, dist_timeout=0)


@pytest.fixture
def rank_1_of_2(monkeypatch):
    """What the loaders see on rank 1 of 2 processes (no process group is needed to build them)."""
    monkeypatch.setattr(comm, "get_world_size", lambda: 2)
    monkeypatch.setattr(comm, "get_rank", lambda: 1)


def test_a_dataloader_is_sharded_per_process_on_several_processes(rank_1_of_2, treadle_caplog):
    loader = torch.utils.data.DataLoader(_data(), batch_size=4, shuffle=False)
    with treadle_caplog.at_level(logging.INFO, logger="treadle.engine"):
        train = trainer_data.per_process(loader, train=True, seed=0)
        evaluation = trainer_data.per_process(loader, train=False)
    assert train.total_batch_size == 8 and train.batch_size == 4
    # Rank 1 takes every second sample of each step's 8 (no shuffle).
    first = next(iter(train))[0].flatten().tolist()
    assert first == [1.0, 3.0, 5.0, 7.0]
    # Evaluation: rank 1's share of 32 samples is the second 16, each counted once.
    assert torch.cat([b[0] for b in evaluation]).flatten().tolist() == [float(i) for i in range(16, 32)]
    assert "The training DataLoader is sharded over 2 processes: batch_size=4 per process" in treadle_caplog.text


def test_an_iterable_that_is_not_a_dataloader_is_read_whole_with_a_warning(rank_1_of_2, treadle_caplog):
    batches = [(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))]
    with treadle_caplog.at_level(logging.WARNING, logger="treadle.engine"):
        assert trainer_data.per_process(batches, train=True) is batches
    assert "list is not a DataLoader: every one of the 2 processes reads all of it" in treadle_caplog.text


def test_a_total_batch_size_the_processes_cannot_share_is_refused_in_one_line(rank_1_of_2):
    with pytest.raises(ValueError, match=r"^total_batch_size=3 is not divisible by the world size 2"):
        trainer_data.as_train_loader(_data(), None, 3)
    loader = trainer_data.as_train_loader(_data(), 4, None)
    assert (loader.total_batch_size, loader.batch_size) == (8, 4)  # batch_size is per process
