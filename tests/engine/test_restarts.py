"""Jobs under torchrun's restarts (``--max-restarts``): a lost process is
restarted and the run ends exact; nothing waits forever.

Each job is two gloo processes on the CPU training the digits example
(``tests/dist_scripts/restart_faults.py``, which kills one process at a
chosen moment) or the plain all_reduce loop
(``tests/dist_scripts/plain_allreduce.py``). The trials are those of
``benchmarks/restart_trials.py``. Every job runs under a bound far above its
usual time: a job past it counts as hung and fails the test. The bounds are
not timings: the machine may be loaded.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("restart_trials", REPO / "benchmarks" / "restart_trials.py")
trials = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trials)

MAX_ITER = 60
BOUND = 300  # seconds for one job, restarts included


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("restarts")


@pytest.fixture(scope="module")
def uninterrupted(workdir) -> Path:
    return trials.uninterrupted(workdir, MAX_ITER)


def _assert_exact_after_a_kill(workdir: Path, name: str, moment: str, seed: int, uninterrupted: Path, nodes: int = 1):
    outcome, fault = trials.treadle_trial(
        workdir, name, moment, random.Random(seed), MAX_ITER, uninterrupted, BOUND, nodes
    )
    log = (workdir / f"{name}.log").read_text()
    assert outcome == "exact", f"{moment} {fault}: {outcome}\n{log[-4000:]}"
    # The fault happened: a process was killed and the group restarted
    # (rank 0 logs its command line once per attempt).
    assert (workdir / f"{name}.killed").exists(), f"no process was killed ({fault})"
    assert log.count("Command line arguments:") >= 2 or fault["moment"] == "startup", log[-4000:]
    iterations = [it for it, _ in trials.metrics_rows(workdir / name)]
    assert iterations == [it for it, _ in trials.metrics_rows(uninterrupted)]


@pytest.mark.parametrize("moment,seed", [("step", 1), ("save-file", 2)])
def test_a_killed_process_is_restarted_and_the_run_ends_exact(workdir, uninterrupted, moment, seed):
    _assert_exact_after_a_kill(workdir, f"one-{moment}", moment, seed, uninterrupted)


@pytest.mark.slow
@pytest.mark.parametrize(
    "moment,seed", [("save-dcp-async", 3), ("save-file-async", 4), ("save-dcp", 5), ("eval", 6), ("startup", 7), ("final", 8)]
)
def test_a_process_killed_at_any_moment_is_restarted_and_the_run_ends_exact(workdir, uninterrupted, moment, seed):
    _assert_exact_after_a_kill(workdir, f"any-{moment}", moment, seed, uninterrupted)


@pytest.mark.slow
def test_two_nodes_one_killed_restart_and_end_exact(workdir, uninterrupted):
    """Two torchrun agents of one process each, met through a c10d rendezvous
    on 127.0.0.1: the same ranks as one agent of two processes, so the same
    weights. The agent whose process died counts a restart, the other does
    not (TORCHELASTIC_RESTART_COUNT differs between them)."""
    _assert_exact_after_a_kill(workdir, "two-nodes", "step", 9, uninterrupted, nodes=2)


@pytest.fixture
def torchrun_store(monkeypatch):
    """A store standing for torchrun's agent's, and the variables torchrun sets."""
    import torch.distributed as dist

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    yield agent


def test_the_ranks_of_an_attempt_meet_over_its_own_store_not_a_dead_attempts(torchrun_store):
    """A dead attempt's entry is still in torchrun's store (as after a
    restart): rank 1 skips it and waits for the new rank 0's."""
    launch = importlib.import_module("treadle.engine.launch")  # the module; treadle.engine.launch is the function

    dead = launch.find_free_port()  # nothing listens there any more
    torchrun_store.set(launch._ATTEMPT_STORE_KEY, f"{dead} 0123456789abcdef")
    found = {}

    def rank1():
        found["store"] = launch._attempt_store(1, 2, time.monotonic() + 60)

    thread = threading.Thread(target=rank1)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive()  # still waiting: the entry is a dead attempt's
    own = launch._attempt_store(0, 2, time.monotonic() + 60)
    thread.join(60)
    assert not thread.is_alive()
    assert own.port != torchrun_store.port
    # Rank 1 reached rank 0's new store: a key set there is seen by it.
    own.set("hello", "from rank 0")
    assert found["store"].get("hello") == b"from rank 0"
    launch._own_store = None


def test_an_attempt_store_that_never_comes_is_a_timeout(torchrun_store):
    launch = importlib.import_module("treadle.engine.launch")
    torchrun_store.set(launch._ATTEMPT_STORE_KEY, f"{launch.find_free_port()} 0123456789abcdef")
    with pytest.raises(TimeoutError):
        launch._attempt_store(1, 2, time.monotonic() + 2)


def _workers(torchrun: subprocess.Popen) -> List[int]:
    return trials._descendants(torchrun.pid)


def _alive(pids: List[int]) -> List[int]:
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _wait_until(condition, bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _kill_torchrun_and_wait_for_its_workers(torchrun: subprocess.Popen, log: Path, bound: float) -> str:
    workers = _workers(torchrun)
    assert len(workers) == 2, workers
    os.kill(torchrun.pid, signal.SIGKILL)
    torchrun.wait()
    try:
        _wait_until(lambda: not _alive(workers), bound, f"workers {_alive(workers)} still running")
    finally:
        for pid in _alive(workers):
            os.kill(pid, signal.SIGKILL)
    return log.read_text()


def test_kill_9_of_torchrun_during_the_set_up_ends_its_workers(tmp_path):
    """Rank 0 waits in the set-up for rank 1, which sleeps first; torchrun is
    killed meanwhile. Before, rank 0 waited in init_process_group forever."""
    log = tmp_path / "job.log"
    cmd = trials.torchrun_commands(
        [trials.PLAIN_SCRIPT, str(tmp_path), "--setup", "treadle", "--timeout", "20", "--rank1-delay", "6"], max_restarts=0
    )[0]
    with open(log, "w") as out:
        torchrun = subprocess.Popen(cmd, cwd=REPO, env=trials._env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until(lambda: len(_workers(torchrun)) == 2, 120, "the workers did not start")
        time.sleep(2)  # rank 0 is starting or in the set-up, rank 1 asleep
        text = _kill_torchrun_and_wait_for_its_workers(torchrun, log, 120)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    # One line each: rank 0 saw torchrun go (or, when it was still importing
    # torch then, waited for the store that went with it); rank 1 waited.
    lines = [line for line in text.splitlines() if line.startswith("error: rank")]
    assert len(lines) == 2, text[-3000:]
    for line in lines:
        assert "torchrun (PID" in line or "waited" in line and "process group's other ranks" in line, lines
    assert "Traceback" not in text
    assert not (tmp_path / "result.txt").exists()


@pytest.mark.slow
def test_kill_9_of_torchrun_during_training_ends_its_workers_with_a_checkpoint(tmp_path):
    out_dir = tmp_path / "run"
    log = tmp_path / "job.log"
    cmd = trials.torchrun_commands(
        [trials.TRAIN_NET, "--config-file", trials.FAULTS_CONFIG, *trials.treadle_overrides(100000),
         "train.checkpointer.period=100000", f"train.output_dir={out_dir}"], max_restarts=0
    )[0]
    with open(log, "w") as out:
        torchrun = subprocess.Popen(cmd, cwd=REPO, env=trials._env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until(lambda: (out_dir / "metrics.json").exists(), 180, "training did not start")
        text = _kill_torchrun_and_wait_for_its_workers(torchrun, log, 180)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
    assert "torchrun (PID" in text and "has ended" in text, text[-3000:]
    # Stopped as after a preemption: a checkpoint to resume from.
    assert (out_dir / "last_checkpoint").exists(), text[-3000:]


def _one_rank_lost(tmp_path: Path, sig: str) -> str:
    """A two-process training job without restarts whose rank 1 gets ``sig``
    at iteration 25; returns the job's output."""
    fault = {"moment": "step", "at": 25, "rank": 1, "delay": 0.0, "signal": sig, "marker": str(tmp_path / "killed")}
    cmd = trials.torchrun_commands(
        [trials.TRAIN_NET, "--config-file", trials.FAULTS_CONFIG, *trials.treadle_overrides(MAX_ITER),
         "train.dist_timeout=15", f"train.output_dir={tmp_path / 'run'}"], max_restarts=0
    )
    log = tmp_path / "job.log"
    status = trials.run_job(cmd, trials._env(fault), BOUND, log)
    text = log.read_text()
    assert status not in (None, 0), f"{status}\n{text[-3000:]}"
    return text


def _survivor_lines(text: str) -> List[str]:
    return [line for line in text.splitlines() if "error (rank 0)" in line]


def test_a_process_in_a_collective_whose_peer_died_exits_with_one_line(tmp_path):
    text = _one_rank_lost(tmp_path, "SIGKILL")
    lines = _survivor_lines(text)
    assert len(lines) == 1, text[-3000:]
    assert "Connection reset by peer" in lines[0] or "Connection closed by peer" in lines[0], lines
    # Said for a reader: what it means and where it was, without gloo's source file.
    assert "another process of the group is gone or stuck" in lines[0] and "raised by" in lines[0], lines
    assert ".cc:" not in lines[0], lines
    assert "[rank0]: Traceback" not in text


@pytest.mark.slow
def test_a_process_in_a_collective_whose_peer_hangs_exits_after_the_timeout_with_one_line(tmp_path):
    """The peer is stopped (SIGSTOP), not dead: its sockets stay open, and
    only train.dist_timeout (15 s here) ends the wait."""
    text = _one_rank_lost(tmp_path, "SIGSTOP")
    lines = _survivor_lines(text)
    assert len(lines) == 1, text[-3000:]
    assert "Timed out" in lines[0] or "timed out" in lines[0], lines
    assert "[rank0]: Traceback" not in text


def test_train_net_passes_train_dist_timeout_to_launch(tmp_path, monkeypatch):
    import datetime

    import treadle.tools.train_net as train_net

    seen = {}

    def fake_launch(main, num_gpus, **kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(train_net, "launch", fake_launch)
    status = train_net.cli(["--config-file", str(REPO / "configs" / "digits_mlp.py"), "train.dist_timeout=42",
                            f"train.output_dir={tmp_path / 'run'}"])
    assert status == 0
    assert seen["timeout"] == datetime.timedelta(seconds=42)


def test_the_default_timeout_is_the_tables():
    import datetime

    from treadle.config.train_keys import train_default
    from treadle.engine.launch import DEFAULT_TIMEOUT

    assert DEFAULT_TIMEOUT == datetime.timedelta(seconds=train_default("dist_timeout")) == datetime.timedelta(minutes=5)
