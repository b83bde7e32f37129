"""Distributed training jobs through ``tools/train_net.py``, in subprocesses.

Two gloo processes on the CPU, started by ``--num-gpus 2`` (``launch`` spawns
them) or by torchrun (one machine, or two "machines" on this host), train the
digits example. The config's batch size is over all ranks, so one process
and two must reach the same weights (to float tolerance: only the order of
the gradient sums differs). Every subprocess runs under a timeout, so a hang
fails its test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

import pytest
import torch

from treadle.config import LazyConfig
from treadle.engine.launch import find_free_port

REPO = Path(__file__).resolve().parents[2]
TRAIN_NET = str(REPO / "tools" / "train_net.py")
FAULTS_CONFIG = str(REPO / "tests" / "dist_scripts" / "digits_faults.py")
TIMEOUT = 180  # seconds for any one job
MAX_ITER = 40
CHECKPOINT_PERIOD = 20
LOG_PERIOD = 10
# The digits example, short and without dropout (ranks draw different masks).
OVERRIDES = [
    f"train.max_iter={MAX_ITER}",
    "lr_multiplier.warmup_iters=5",
    f"train.checkpointer.period={CHECKPOINT_PERIOD}",
    f"train.log_period={LOG_PERIOD}",
    "train.eval_period=0",  # evaluate once, after training, on every rank
]
DIGITS = ["model.dropout=0.0", *OVERRIDES]
FAULTS_WITH_DROPOUT = ["--config-file", FAULTS_CONFIG, *OVERRIDES]
FAULTS = [*FAULTS_WITH_DROPOUT, "model.model.dropout=0.0"]


def _env() -> Dict[str, str]:
    # No inherited torchrun variables: each job sets up its own process group.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a crashing worker shows its Python stack
    return env


def _train_net(output_dir: Path, *args: str, launcher: Sequence[str] = (), expect_rc: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *launcher, TRAIN_NET, *args, f"train.output_dir={output_dir}"]
    result = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    # Kept next to the output directory, for a look after a failure.
    (output_dir.parent / f"{output_dir.name}.out").write_text(result.stdout + "\n--- stderr\n" + result.stderr)
    if result.returncode != expect_rc:
        pytest.fail(
            f"{' '.join(cmd)} exited with {result.returncode}, expected {expect_rc}\n"
            f"--- stdout (end)\n{result.stdout[-3000:]}\n--- stderr (end)\n{result.stderr[-3000:]}"
        )
    return result


def _weights(path: Path, strip: str = "") -> Dict[str, torch.Tensor]:
    state = torch.load(path, weights_only=True)["model"]
    return {k[len(strip):] if k.startswith(strip) else k: v for k, v in state.items()}


def _assert_close(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    assert list(a) == list(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


def _assert_equal(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b)
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"not bit-identical: {unequal}"


def _metrics_iterations(output_dir: Path) -> List[int]:
    return [json.loads(line)["iteration"] for line in (output_dir / "metrics.json").read_text().splitlines()]


def _ddp_kind_override(kind: str) -> str:
    """``train.ddp.kind=...``, or ``+train.ddp.kind=...`` while the config has no such key yet."""
    cfg = LazyConfig.load(str(REPO / "configs" / "digits_mlp.py"))
    return ("" if "kind" in cfg.train.ddp else "+") + f"train.ddp.kind={kind}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Output directories of jobs that several tests compare against, run once."""
    return {"root": tmp_path_factory.mktemp("jobs")}


@pytest.fixture(scope="module")
def one_process(runs) -> Path:
    out = runs["root"] / "one_process"
    _train_net(out, *DIGITS)
    return out


@pytest.fixture(scope="module")
def two_processes(runs) -> Path:
    out = runs["root"] / "two_processes"
    # An unknown key (ignored, with a warning) to see where the warning goes.
    runs["two_processes_result"] = _train_net(out, "--num-gpus", "2", *DIGITS, "+train.new_key=1")
    return out


def test_two_processes_train_as_one_process(one_process, two_processes):
    """2 ranks x 32 samples per step give the weights of 1 rank x 64."""
    _assert_close(_weights(two_processes / "model_final.pth"), _weights(one_process / "model_final.pth"))


def test_only_the_main_process_writes(runs, two_processes):
    names = sorted(os.listdir(two_processes))
    assert [n for n in names if n.startswith("log.txt")] == ["log.txt", "log.txt.rank1"]
    assert len([n for n in names if n.startswith("events.out.tfevents")]) == 1
    assert [n for n in names if n.endswith(".pth")] == ["model_0000019.pth", "model_best.pth", "model_final.pth"]
    # One metrics.json writer: each flush once (the final evaluation is put at MAX_ITER).
    assert _metrics_iterations(two_processes) == [9, 19, 29, 39, MAX_ITER]
    # Console: rank 0 only; the log files: one rank each.
    stdout = runs["two_processes_result"].stdout
    assert stdout.count("Rank of current process:") == 1 and "Rank of current process: 0." in stdout
    assert "Rank of current process: 0." in (two_processes / "log.txt").read_text()
    rank1_log = (two_processes / "log.txt.rank1").read_text()
    assert "Rank of current process: 1." in rank1_log and "Rank of current process: 0." not in rank1_log
    # The config warning: in rank 0's log.txt once, and never printed bare (no
    # handler in a worker: Python's last-resort stderr) nor by rank 1.
    warning = "train.new_key is not a key that DefaultTrainer reads"
    assert (two_processes / "log.txt").read_text().count(warning) == 1 and warning not in rank1_log
    result = runs["two_processes_result"]
    printed = [line for line in (result.stdout + result.stderr).splitlines() if warning in line]
    # Once, formatted: the launching process showed it, and rank 0, which
    # checks the job again, does not show it a second time.
    assert len(printed) == 1 and "WARNING" in printed[0], printed
    # Both ranks evaluated (every rank runs its shard, the results are reduced).
    assert rank1_log.count("Evaluation after 40 iterations") == 1


@pytest.mark.slow
def test_torchrun_on_one_machine(one_process, tmp_path):
    _train_net(tmp_path, *DIGITS, launcher=["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"])
    assert (tmp_path / "log.txt.rank1").exists()
    _assert_close(_weights(tmp_path / "model_final.pth"), _weights(one_process / "model_final.pth"))


@pytest.mark.slow
def test_torchrun_on_two_machines(one_process, tmp_path):
    """Two torchrun agents on this host, one process each, as two machines would be started."""
    port = find_free_port()
    procs = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            TRAIN_NET, *DIGITS, f"train.output_dir={tmp_path}",
        ]
        log = open(tmp_path.parent / f"{tmp_path.name}-node{node}.txt", "w")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT), log))
    try:
        # Polled together: when one node fails, torchrun's agent on the other
        # waits minutes at its exit barrier; the failure is the news.
        deadline = time.monotonic() + TIMEOUT
        while any(p.poll() is None for p, _ in procs) and all(p.poll() in (None, 0) for p, _ in procs):
            assert time.monotonic() < deadline, "the two torchrun agents did not finish in time"
            time.sleep(0.2)
        codes = [p.poll() for p, _ in procs]
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            log.close()
    assert codes == [0, 0], [Path(log.name).read_text()[-3000:] for _, log in procs]
    assert "Rank of current process: 1. World size: 2" in (tmp_path / "log.txt.rank1").read_text()
    _assert_close(_weights(tmp_path / "model_final.pth"), _weights(one_process / "model_final.pth"))


class _PausedJob:
    """A 2-rank ``job`` (through ``--num-gpus 2``) whose rank 0 waits at iteration
    ``at`` for as long as the marker file exists; its own process group."""

    def __init__(self, run: Path, job: Sequence[str], at: int) -> None:
        self.marker = run.parent / f"{run.name}-paused"
        self.log_path = run.parent / f"{run.name}-launcher.txt"
        cmd = [
            sys.executable, TRAIN_NET, "--num-gpus", "2", *job, "model.rank=0",
            f"model.pause_at_iter={at}", f"model.pause_marker={self.marker}", f"train.output_dir={run}",
        ]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for_pause(self) -> None:
        deadline = time.monotonic() + TIMEOUT
        while not self.marker.exists():
            assert self.proc.poll() is None, f"the job ended before pausing:\n{self.log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the job did not reach its pause"
            time.sleep(0.05)

    def workers(self) -> List[int]:
        """The pids of the launcher's spawned worker processes."""
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            if ppid == self.proc.pid and b"spawn_main" in cmdline:
                pids.append(int(entry.name))
        return pids

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()


def _kill_at_iteration_27(run: Path, job: Sequence[str]) -> None:
    """Runs a 2-rank ``job`` until iteration 27 and SIGKILLs its process group there."""
    paused = _PausedJob(run, job, at=27)
    try:
        paused.wait_for_pause()
        os.killpg(paused.proc.pid, signal.SIGKILL)  # the launcher and its worker processes
    finally:
        paused.close()
    assert (run / "last_checkpoint").read_text() == "model_0000019.pth"
    assert not (run / "model_final.pth").exists()


@pytest.mark.slow
def test_resume_after_kill_9_is_exact(two_processes, tmp_path):
    """A 2-rank run killed (SIGKILL to the launcher's process group) between
    checkpoints, resumed with ``--resume`` on 2 ranks, ends bit-identical to
    the uninterrupted run. The job is the digits one inside a wrapper that
    pauses rank 0 at iteration 27 so that the kill lands there."""
    run = tmp_path / "run"
    _kill_at_iteration_27(run, FAULTS)
    _train_net(run, "--num-gpus", "2", "--resume", *FAULTS)
    resumed = _weights(run / "model_final.pth", strip="model.")
    _assert_equal(resumed, _weights(two_processes / "model_final.pth"))
    assert "Resuming from" in (run / "log.txt").read_text()


@pytest.mark.slow
def test_resume_with_dropout_after_kill_9_is_exact(tmp_path):
    """As above, with dropout on: each rank draws its own masks from its own generator."""
    job = [*FAULTS_WITH_DROPOUT, "model.model.dropout=0.1"]
    _train_net(tmp_path / "reference", "--num-gpus", "2", *job)
    run = tmp_path / "run"
    _kill_at_iteration_27(run, job)
    _train_net(run, "--num-gpus", "2", "--resume", *job)
    _assert_equal(_weights(run / "model_final.pth"), _weights(tmp_path / "reference" / "model_final.pth"))


@contextlib.contextmanager
def _two_rank_job_paused_at_15(run: Path) -> Iterator[Tuple[_PausedJob, List[int]]]:
    """The 2-rank FAULTS job with rank 0 paused at iteration 15, and its two workers' pids."""
    paused = _PausedJob(run, FAULTS, at=15)
    try:
        paused.wait_for_pause()
        workers = paused.workers()
        assert len(workers) == 2
        yield paused, workers
    finally:
        paused.close()


def _assert_stopped_at_19_and_resumes_exactly(run: Path, uninterrupted: Path, reason: str) -> None:
    """Both ranks of a job paused at iteration 15 stopped at their next check
    (19) for ``reason``, with a checkpoint there and no model_final, and
    ``--resume`` ends bit-identical to the uninterrupted run."""
    for log in ("log.txt", "log.txt.rank1"):
        assert f"Stop requested at iteration 19: {reason}" in (run / log).read_text()
    assert (run / "last_checkpoint").read_text() == "model_0000019.pth"
    assert not (run / "model_final.pth").exists()
    _train_net(run, "--num-gpus", "2", "--resume", *FAULTS)
    _assert_equal(_weights(run / "model_final.pth", strip="model."), _weights(uninterrupted / "model_final.pth"))


@pytest.mark.slow
def test_preemption_of_a_two_rank_job(two_processes, tmp_path):
    """SIGTERM, as a scheduler sends it to every process of the job, while
    rank 0 is at iteration 15: the ranks agree to stop at their next check
    (iteration 19), the launcher survives its own SIGTERM and exits with the
    workers' status 75, and ``--resume`` ends bit-identical to the
    uninterrupted run."""
    run = tmp_path / "run"
    with _two_rank_job_paused_at_15(run) as (paused, workers):
        for pid in [paused.proc.pid, *workers]:
            os.kill(pid, signal.SIGTERM)
        paused.marker.unlink()  # rank 0 goes on; its signal is handled before its next step
        assert paused.proc.wait(timeout=TIMEOUT) == 75, paused.log_path.read_text()[-3000:]
    _assert_stopped_at_19_and_resumes_exactly(run, two_processes, "preempted by")


@pytest.mark.slow
def test_kill_9_of_the_launcher_alone_ends_its_workers_as_a_preemption(two_processes, tmp_path):
    """``kill -9 LAUNCHER_PID`` (not the process group): the launcher's
    handlers never run, and its workers used to train on, orphaned, holding
    the output folder. The kernel now sends each worker SIGTERM when the
    launcher ends: they stop together at their next agreed check, checkpoint
    there, and ``--resume`` ends bit-identical to the uninterrupted run."""
    run = tmp_path / "run"
    with _two_rank_job_paused_at_15(run) as (paused, workers):
        os.kill(paused.proc.pid, signal.SIGKILL)
        paused.proc.wait(timeout=30)
        paused.marker.unlink()  # rank 0 goes on to its next check
        deadline = time.monotonic() + TIMEOUT
        while any(Path(f"/proc/{pid}").exists() for pid in workers):
            assert time.monotonic() < deadline, "the workers outlived their launcher"
            time.sleep(0.1)
    _assert_stopped_at_19_and_resumes_exactly(run, two_processes, "preempted by SIGTERM")


@pytest.mark.slow
def test_preemption_in_the_last_partial_sync_period_finishes_on_resume(two_processes, tmp_path):
    """SIGTERM on rank 1 at iteration 25 of 40 (the ranks agree every 20
    iterations): they stop at the last iteration, the job exits 75 without
    model_final, and --resume does only the end of training: final
    evaluation and model_final, equal to the uninterrupted run's."""
    run = tmp_path / "run"
    _train_net(run, "--num-gpus", "2", *FAULTS, "model.signal_at_iter=25", expect_rc=75)
    assert (run / "last_checkpoint").read_text() == f"model_{MAX_ITER - 1:07d}.pth"
    assert not (run / "model_final.pth").exists()
    result = _train_net(run, "--num-gpus", "2", "--resume", *FAULTS)
    assert "running the end of training" in result.stdout
    _assert_equal(_weights(run / "model_final.pth", strip="model."), _weights(two_processes / "model_final.pth"))
    final = [json.loads(line) for line in (run / "metrics.json").read_text().splitlines() if "accuracy" in line]
    assert [line["iteration"] for line in final] == [MAX_ITER]


def test_nan_on_one_rank_stops_every_rank(tmp_path):
    """NaN logits on rank 1 from iteration 13: the losses are reduced at the
    flush of iteration 19, where every rank raises the same error."""
    result = _train_net(tmp_path, "--num-gpus", "2", *FAULTS, "model.nan_from_iter=13", expect_rc=1)
    assert "Loss became non-finite at iteration 13: total_loss=nan" in result.stderr
    for log in ("log.txt", "log.txt.rank1"):
        text = (tmp_path / log).read_text()
        assert "Exception during training at iteration 19:" in text
        assert "Loss became non-finite at iteration 13" in text
    # The failing flush is still written; nothing after it, and no final checkpoint.
    assert _metrics_iterations(tmp_path) == [9, 19]
    assert not (tmp_path / "model_final.pth").exists()


def test_exception_on_one_rank_stops_every_rank(tmp_path):
    """Rank 1 raises at iteration 13; rank 0, waiting in the gradient
    all-reduce, gets a connection error instead of hanging."""
    result = _train_net(tmp_path, "--num-gpus", "2", *FAULTS, "model.raise_at_iter=13", expect_rc=1)
    assert "RuntimeError: injected failure on rank 1 at iteration 13" in result.stderr
    assert "Exception during training at iteration 13:" in (tmp_path / "log.txt.rank1").read_text()
    assert "Exception during training at iteration 13:" in (tmp_path / "log.txt").read_text()
    assert not (tmp_path / "model_final.pth").exists()


@pytest.fixture(scope="module")
def fsdp_run(runs) -> Path:
    out = runs["root"] / "fsdp"
    # The gathered single-file format; the sharded default under FSDP is tested in tests/checkpoint/test_dcp_distributed.py.
    _train_net(out, "--num-gpus", "2", *DIGITS, _ddp_kind_override("fsdp"), "train.checkpointer.format=file")
    return out


def test_fsdp_trains_as_one_process(one_process, fsdp_run):
    _assert_close(_weights(fsdp_run / "model_final.pth"), _weights(one_process / "model_final.pth"))
    # A full, plain checkpoint: the optimizer state is in torch's own format.
    saved = torch.load(fsdp_run / "model_0000019.pth", weights_only=True)
    plain = torch.load(one_process / "model_0000019.pth", weights_only=True)
    assert saved["optimizer"]["param_groups"] == plain["optimizer"]["param_groups"]
    for index, state in plain["optimizer"]["state"].items():
        torch.testing.assert_close(saved["optimizer"]["state"][index]["momentum_buffer"], state["momentum_buffer"], rtol=0, atol=1e-6)


def _from_checkpoint(source: Path, name: str, dest: Path) -> Path:
    """An output directory holding only ``source/name``, named by ``last_checkpoint``."""
    dest.mkdir()
    shutil.copy(source / name, dest / name)
    (dest / "last_checkpoint").write_text(name)
    return dest


@pytest.mark.slow
def test_fsdp_resumes_a_ddp_checkpoint_and_back(one_process, two_processes, fsdp_run, tmp_path):
    """A DDP checkpoint resumes as FSDP, and an FSDP checkpoint as a single process."""
    as_fsdp = _from_checkpoint(two_processes, "model_0000019.pth", tmp_path / "as_fsdp")
    _train_net(as_fsdp, "--num-gpus", "2", "--resume", *DIGITS, _ddp_kind_override("fsdp"), "train.checkpointer.format=file")
    _assert_close(_weights(as_fsdp / "model_final.pth"), _weights(two_processes / "model_final.pth"))

    as_plain = _from_checkpoint(fsdp_run, "model_0000019.pth", tmp_path / "as_plain")
    _train_net(as_plain, "--resume", *DIGITS)
    _assert_close(_weights(as_plain / "model_final.pth"), _weights(one_process / "model_final.pth"))


def test_user_error_in_a_worker_is_one_line(tmp_path):
    """A wrong argument to a target is found when the workers build the
    model: the job still ends with the one-line message and status 2 of a
    single process, printed once, not with a worker's traceback."""
    result = _train_net(tmp_path, "--num-gpus", "2", *DIGITS, "+model.num_layers=3", expect_rc=2)
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "num_layers" in errors[0] and "'model'" in errors[0]
    assert "Traceback" not in result.stderr
