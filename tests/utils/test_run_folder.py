"""The run folder: one owner, no silent overwrite, runs that always finish.

Unit tests of :class:`RunFolder`, then the rules as ``tools/train_net.py``
and the plain ``Trainer`` apply them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest
import torch
from torch.utils.data import DataLoader

from treadle.trainer import Trainer
from treadle.tools.train_net import _JobSignals, cli
from treadle.utils.run_folder import (
    LOCK_FILE,
    RunFolder,
    RunFolderBusyError,
    RunFolderUsedError,
    check_output_dir,
)

from tests.run_files import snapshot

ROOT = Path(__file__).resolve().parents[2]
TRAIN_NET = ROOT / "tools" / "train_net.py"
FAULTS_CONFIG = str(ROOT / "tests" / "dist_scripts" / "digits_faults.py")
SHORT = [
    "train.max_iter=40",
    "train.eval_period=20",
    "train.checkpointer.period=20",
    "train.log_period=10",
    "lr_multiplier.warmup_iters=5",
]


# ---------------------------------------------------------------------- RunFolder
def test_lock_names_its_holder_and_is_released(tmp_path):
    first = RunFolder(str(tmp_path / "run"))
    first.acquire()
    info = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    with pytest.raises(RunFolderBusyError, match=rf"in use by another job: PID {os.getpid()} on host {socket.gethostname()}"):
        RunFolder(str(tmp_path / "run")).acquire()
    first.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    with RunFolder(str(tmp_path / "run")) as again:
        assert again.locked


def test_lock_held_by_another_process_then_freed_by_kill_9(tmp_path, treadle_caplog):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from treadle.utils.run_folder import RunFolder; "
         f"RunFolder({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusyError, match=f"PID {holder.pid}"):
            RunFolder(str(folder)).acquire()
        holder.kill()  # kill -9: no clean-up, the lock file stays
        holder.wait()
        assert (folder / LOCK_FILE).exists()
        taken = RunFolder(str(folder))
        taken.acquire()  # the kernel released the lock with the process
        assert f"left by PID {holder.pid}" in treadle_caplog.text and "no longer running" in treadle_caplog.text
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
        taken.release()
    finally:
        holder.kill()


def test_fresh_start_in_a_used_folder_is_refused_and_changes_nothing(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"iteration": 9}\n')
    (folder / "model_0000009.pth").write_bytes(b"weights")
    before = snapshot(folder)
    with pytest.raises(RunFolderUsedError, match="holds an earlier run .*--resume.*--move-aside"):
        RunFolder(str(folder)).claim(resume=False)
    assert snapshot(folder) == before and not (folder / LOCK_FILE).exists()
    resumed = RunFolder(str(folder))
    resumed.claim(resume=True)  # continuing the run is allowed
    resumed.release()


def test_a_refused_fresh_start_names_the_checkpoints_first(tmp_path):
    # The files came in alphabetical order: TensorBoard's events first.
    folder = tmp_path / "run"
    folder.mkdir()
    for name in ("events.out.tfevents.1.vm.2.0", "metrics.json", "model_final.pth", "last_checkpoint"):
        (folder / name).write_text("x")
    before = snapshot(folder)
    with pytest.raises(RunFolderUsedError, match=r"\(last_checkpoint, model_final.pth, metrics.json, events\.out"):
        RunFolder(str(folder)).claim(resume=False)
    assert snapshot(folder) == before and not (folder / LOCK_FILE).exists()


def test_check_finds_what_claim_would_refuse_and_writes_nothing(tmp_path):
    RunFolder(str(tmp_path / "new")).check(resume=False)
    assert not (tmp_path / "new").exists()  # not even the folder
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"iteration": 9}\n')
    before = snapshot(folder)
    with pytest.raises(RunFolderUsedError, match="holds an earlier run"):
        RunFolder(str(folder)).check(resume=False)
    RunFolder(str(folder)).check(resume=True)
    RunFolder(str(folder)).check(resume=False, move_aside=True)  # the claim moves it
    assert snapshot(folder) == before
    with RunFolder(str(folder)):
        held = snapshot(folder)
        with pytest.raises(RunFolderBusyError, match=f"in use by another job: PID {os.getpid()}"):
            RunFolder(str(folder)).check(resume=True)
        assert snapshot(folder) == held


def test_config_and_log_alone_do_not_make_a_used_folder(tmp_path):
    (tmp_path / "config.yaml").write_text("a job that failed before training\n")
    (tmp_path / "log.txt").write_text("...\n")
    folder = RunFolder(str(tmp_path))
    folder.claim(resume=False)
    folder.release()


def test_move_aside_keeps_every_file_of_the_earlier_run(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"iteration": 9}\n')
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("mine")
    before = snapshot(folder)
    run = RunFolder(str(folder))
    run.claim(resume=False, move_aside=True)
    moved = Path(run.moved_to)
    assert moved.parent == tmp_path and moved.name.startswith("run.old-")
    assert snapshot(moved) == before  # the lock did not go with it
    assert os.listdir(folder) == [LOCK_FILE] and run.locked
    run.release()
    assert os.listdir(folder) == []


def test_check_output_dir_writes_nothing(tmp_path):
    check_output_dir(str(tmp_path / "a" / "b"))
    assert not (tmp_path / "a").exists()
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="is a file"):
        check_output_dir(str(blocker / "out"))


# ---------------------------------------------------------------------- train_net
def test_two_jobs_on_one_folder(tmp_path):
    """While a job runs (held at iteration 25), a second one on its folder is
    refused at once, naming the first's PID; the first then ends intact."""
    out, marker = tmp_path / "run", tmp_path / "paused"
    first = subprocess.Popen(
        [sys.executable, str(TRAIN_NET), "--config-file", FAULTS_CONFIG, f"train.output_dir={out}", *SHORT,
         "model.rank=0", "model.pause_at_iter=25", f"model.pause_marker={marker}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the first job did not reach iteration 25"
        before = (out / "metrics.json").read_text()
        for extra in ([], ["--resume"]):
            second = subprocess.run(
                [sys.executable, str(TRAIN_NET), f"train.output_dir={out}", *SHORT, *extra],
                cwd=ROOT, capture_output=True, text=True, timeout=120,
            )
            errors = [line for line in second.stderr.splitlines() if line.strip()]
            assert second.returncode == 2 and len(errors) == 1, second.stderr
            assert f"in use by another job: PID {first.pid}" in errors[0]
        assert (out / "metrics.json").read_text() == before
        marker.unlink()
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    finally:
        first.kill()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [9, 19, 29, 39, 40]  # each once, the final evaluation last
    assert not (out / LOCK_FILE).exists()


def test_move_aside_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT]) == 0
    before = snapshot(out)
    assert cli([f"train.output_dir={out}", *SHORT]) == 2
    assert "holds an earlier run" in capsys.readouterr().err
    assert cli([f"train.output_dir={out}", *SHORT, "--move-aside"]) == 0
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before
    # The new run is a run of its own: its own metrics, checkpoints and best.
    assert (out / "model_final.pth").exists() and (out / "model_best.pth").exists()
    assert [json.loads(line)["iteration"] for line in (out / "metrics.json").read_text().splitlines()][0] == 9


def test_eval_only_leaves_the_runs_files_alone(tmp_path):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT]) == 0
    before = snapshot(out)
    assert cli([f"train.output_dir={out}", *SHORT, "--eval-only", "--resume"]) == 0
    assert cli([f"train.output_dir={out}", *SHORT, "--eval-only", f"train.init_checkpoint={out / 'model_0000019.pth'}"]) == 0
    after = snapshot(out)
    evals = sorted(k for k in after if k.startswith("eval/"))
    assert {k: v for k, v in after.items() if not k.startswith("eval/")} == before
    results = [json.loads((out / k).read_text()) for k in evals if k.endswith("results.json")]
    assert sorted(Path(r["weights"]).name for r in results) == ["model_0000019.pth", "model_final.pth"]
    assert all(0.0 <= r["results"]["accuracy"] <= 1.0 for r in results)
    assert len([k for k in evals if k.endswith("config.yaml")]) == 2
    assert len([k for k in evals if k.endswith("log.txt")]) == 2


def _weights(path: Path) -> Dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


def test_preemption_at_the_last_iteration_then_resume_finishes(tmp_path):
    """SIGTERM at the last iteration: exit 75, a checkpoint at max_iter - 1 and
    no model_final; --resume runs the end of training only, exits 0, and its
    model_final equals an uninterrupted run's."""
    faults = ["--config-file", FAULTS_CONFIG, *SHORT, "model.rank=0", "model.model.dropout=0.0"]
    reference, run = tmp_path / "reference", tmp_path / "run"
    assert cli([f"train.output_dir={reference}", *faults]) == 0
    assert cli([f"train.output_dir={run}", *faults, "model.signal_at_iter=39"]) == 75
    assert (run / "last_checkpoint").read_text() == "model_0000039.pth"
    assert not (run / "model_final.pth").exists()
    assert cli([f"train.output_dir={run}", *faults, "--resume"]) == 0
    final, expected = _weights(run / "model_final.pth"), _weights(reference / "model_final.pth")
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    evaluations = [json.loads(line)["iteration"] for line in (run / "metrics.json").read_text().splitlines() if "accuracy" in line]
    assert evaluations == [19, 40]
    assert (run / "model_best.pth").exists()
    # Resuming once more: the run is finished now.
    assert cli([f"train.output_dir={run}", *faults, "--resume"]) == 0
    assert _weights(run / "model_final.pth").keys() == expected.keys()


def test_resume_keeps_the_config_learning_rate_and_says_so(tmp_path, treadle_caplog):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT, "train.max_iter=20"]) == 0
    assert cli([f"train.output_dir={out}", *SHORT, "--resume", "optimizer.lr=0.5", "optimizer.momentum=0.5"]) == 0
    text = treadle_caplog.text
    assert "Resuming with optimizer.lr=0.5 from the config; the checkpoint has 0.05" in text
    assert "Resuming with optimizer.momentum=0.5" in text
    final = torch.load(out / "model_final.pth", weights_only=True)
    groups = final["optimizer"]["param_groups"]
    assert {g["initial_lr"] for g in groups} == {0.5} and {g["momentum"] for g in groups} == {0.5}
    # The schedule goes on from its position with the new base rate: at iteration 29
    # of 40 the cosine multiplier is ~0.18, so the rate is above the old base rate.
    lrs = {r["iteration"]: r["lr"] for r in map(json.loads, (out / "metrics.json").read_text().splitlines()) if "lr" in r}
    assert 0.05 < lrs[29] < 0.5


def test_unchanged_resume_warns_about_nothing(tmp_path, treadle_caplog):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT, "train.max_iter=20"]) == 0
    assert cli([f"train.output_dir={out}", *SHORT, "--resume"]) == 0
    assert "Resuming with" not in treadle_caplog.text


def test_max_to_keep_counts_only_this_runs_checkpoints(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    foreign = out / "model_0000005.pth"  # another run's file, copied in by hand
    foreign.write_bytes(b"not ours")
    (out / "last_checkpoint").write_text("model_0000005.pth")
    assert cli([f"train.output_dir={out}", *SHORT, "train.checkpointer.period=5", "train.checkpointer.max_to_keep=2", "--move-aside"]) == 0
    # Moved aside with the folder; now inside the new run: only its own files are rotated.
    (out / "model_0000001.pth").write_bytes(b"foreign too")
    assert cli([f"train.output_dir={out}", *SHORT, "train.max_iter=60", "train.checkpointer.period=5",
                "train.checkpointer.max_to_keep=2", "--resume"]) == 0
    names = sorted(p.name for p in out.glob("model_*.pth"))
    assert names == ["model_0000001.pth", "model_0000049.pth", "model_0000054.pth", "model_best.pth", "model_final.pth"]


# ---------------------------------------------------------------------- signals outside training
def test_job_signal_before_training_exits_75_and_while_stopping_or_after_training_is_noted(treadle_caplog):
    previous = _JobSignals.install()
    try:
        _JobSignals.phase = "starting"
        with pytest.raises(SystemExit) as exited:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        assert exited.value.code == 75 and "Received SIGTERM before training started" in treadle_caplog.text
        # A stopping job's status is decided and it is on its way out: an
        # exception raised from the handler landed in a garbage-collector
        # callback during the exit and printed a traceback
        # (test_a_second_sigterm_after_the_checkpoint_still_exits_75, now and then).
        for phase, said in (("stopping", "while the job stops; it is exiting already"), ("over", "after training ended")):
            _JobSignals.phase = phase
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            assert f"Received SIGTERM {said}" in treadle_caplog.text
    finally:
        _JobSignals.restore(previous)
    assert signal.getsignal(signal.SIGTERM) == previous[signal.SIGTERM]


# Code a job runs through while it starts (imports of torch, numpy and model
# libraries) may catch everything: a signal that raised SystemExit there was
# swallowed and the job trained on (or a half-loaded C extension aborted it).
_SWALLOWING_CODE = """
import os, signal, sys, time
{install}
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
except:  # noqa: E722 - a library's bare except
    pass
print("trained on")
"""


@pytest.mark.parametrize("install", [
    "from treadle.tools.script import _exit_for_retry; signal.signal(signal.SIGTERM, _exit_for_retry)",
    "from treadle.tools.train_net import _JobSignals; _JobSignals.install(standalone=True)",
], ids=["before-the-job-imports", "before-training"])
def test_a_signal_while_starting_ends_the_process_even_under_a_bare_except(install):
    job = subprocess.run([sys.executable, "-c", _SWALLOWING_CODE.format(install=install)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert job.returncode == 75, job.stderr
    assert "trained on" not in job.stdout
    assert "SIGTERM" in job.stderr and "status 75" in job.stderr and "Traceback" not in job.stderr


def test_the_launcher_passes_on_a_signal_that_arrives_while_it_spawns():
    import multiprocessing

    from treadle.engine.launch import _SignalForwarder

    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    with _SignalForwarder() as forwarder:
        os.kill(os.getpid(), signal.SIGTERM)  # before any worker exists: held
        time.sleep(0.05)
        assert forwarder.forwarded == {signal.SIGTERM}
        worker.start()
        forwarder.attach([worker])
        worker.join(timeout=60)
    assert worker.exitcode == -signal.SIGTERM


# ---------------------------------------------------------------------- plain Trainer
def _tiny_trainer(out: Path) -> Trainer:
    torch.manual_seed(0)
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(5)]  # ready batches
    return Trainer(torch.nn.Linear(3, 2), "sgd", DataLoader(data, batch_size=None), lr=0.1, loss_fn=torch.nn.functional.cross_entropy,
                   max_epochs=2, output_dir=str(out), progress_bar=False)


def test_trainer_twice_on_one_folder_is_refused_unless_moved_aside(tmp_path):
    out = tmp_path / "run"
    _tiny_trainer(out).train()
    before = snapshot(out)
    with pytest.raises(RunFolderUsedError, match=r"Call train\(resume=True\) to continue it, choose another output_dir, or call train\(move_aside=True\)"):
        _tiny_trainer(out).train()
    assert snapshot(out) == before
    trainer = _tiny_trainer(out)
    with pytest.raises(RunFolderUsedError):
        trainer.train()  # the same object, a second time: still a fresh start
    trainer.train(move_aside=True)
    moved = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(moved) == 1 and snapshot(moved[0]) == before
    assert (out / "model_final.pth").exists()
    _tiny_trainer(out).train(resume=True)  # resuming is always allowed


# ---------------------------------------------------------------------- run-time failures
def test_disk_full_at_a_checkpoint_is_one_line_and_the_last_checkpoint_loads(tmp_path, capfd, monkeypatch):
    import errno

    from treadle.checkpoint import file_writer
    from treadle.checkpoint import load_checkpoint_file

    real_write = file_writer.atomic_write

    def full_disk(path, write, *args, **kwargs):
        if str(path).endswith("model_0000039.pth"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_write(path, write, *args, **kwargs)

    monkeypatch.setattr(file_writer, "atomic_write", full_disk)
    out = tmp_path / "run"
    code = cli([f"train.output_dir={out}", *SHORT, "train.max_iter=60"])
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, stderr
    assert "model_0000039.pth" in lines[0] and "No space left on device" in lines[0]
    assert "Traceback" not in stdout + stderr
    assert (out / "last_checkpoint").read_text() == "model_0000019.pth"
    assert load_checkpoint_file(str(out / "model_0000019.pth"))["iteration"] == 19
    assert "Traceback" in (out / "log.txt").read_text()  # the details are kept in the log
    assert not (out / LOCK_FILE).exists()


def test_exception_in_a_hook_is_one_line_naming_the_hook(tmp_path, capfd, monkeypatch):
    from treadle.hooks import EvalHook

    def broken(self, *where):
        raise ZeroDivisionError("division by zero in my metric")

    monkeypatch.setattr(EvalHook, "_do_eval", broken)
    out = tmp_path / "run"
    code = cli([f"train.output_dir={out}", *SHORT])
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, stderr
    assert lines[0].endswith(
        f"ZeroDivisionError: division by zero in my metric (raised by hook EvalHook.after_step at iteration 19; "
        f"traceback in {out / 'log.txt'})"
    )
    assert "Traceback" not in stdout + stderr


def test_eval_only_resume_with_a_garbage_pointer_evaluates_the_newest_checkpoint(tmp_path):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT]) == 0
    (out / "last_checkpoint").write_bytes(b"\x00\xffjunk")
    (out / "model_final.pth").unlink()
    (out / "model_best.pth").unlink()
    assert cli([f"train.output_dir={out}", *SHORT, "--eval-only", "--resume"]) == 0
    (result,) = [json.loads(p.read_text()) for p in out.glob("eval/*/results.json")]
    assert Path(result["weights"]).name == "model_0000019.pth"


# ---------------------------------------------------------------------- signals and Ctrl-C, as the command sees them
def _paused_job(out, marker, *extra):
    return subprocess.Popen(
        [sys.executable, str(TRAIN_NET), "--config-file", FAULTS_CONFIG, f"train.output_dir={out}", *SHORT,
         "model.rank=0", "model.pause_at_iter=25", f"model.pause_marker={marker}", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _wait_for(path, proc, seconds=120):
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert path.exists(), proc.stderr.read()[-2000:] if proc.poll() is not None else "timed out"


@pytest.mark.slow
def test_a_second_sigterm_after_the_checkpoint_still_exits_75(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "paused"
    job = _paused_job(out, marker)
    try:
        _wait_for(marker, job)
        job.send_signal(signal.SIGTERM)
        marker.unlink()  # on to the end of iteration 25: the checkpoint, then the stop
        deadline = time.monotonic() + 60
        while not (out / "model_0000025.pth").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        for _ in range(3):  # the scheduler insists while the job shuts down
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)
            time.sleep(0.05)
        assert job.wait(timeout=120) == 75
        assert "Traceback" not in job.stderr.read()
    finally:
        job.kill()
    assert (out / "last_checkpoint").read_text() == "model_0000025.pth"


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 1.5])
def test_sigterm_while_the_job_starts_exits_75(tmp_path, delay):
    """Before the job's own handlers exist (Python importing torch, say), a
    signal must not be a death by signal (143), which a requeue loop takes
    for a crash."""
    for extra in ([], ["--num-gpus", "2"]):
        job = subprocess.Popen([sys.executable, str(TRAIN_NET), f"train.output_dir={tmp_path / str(len(extra))}", *SHORT, *extra],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        job.send_signal(signal.SIGTERM)
        try:
            assert job.wait(timeout=120) == 75, extra
            assert "Traceback" not in job.stderr.read()
        finally:
            job.kill()


def test_ctrl_c_is_one_line_and_the_writers_close(tmp_path, capfd, monkeypatch):
    from treadle.hooks import EvalHook

    def interrupted(self, *where):
        raise KeyboardInterrupt

    monkeypatch.setattr(EvalHook, "_do_eval", interrupted)
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT]) == 130
    stdout, stderr = capfd.readouterr()
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "interrupted (Ctrl-C) at hook EvalHook.after_step at iteration 19" in lines[0], stderr
    assert "Traceback" not in stdout + stderr
    # The writers' after_train ran: the flush of iteration 19 is in metrics.json.
    assert [json.loads(line)["iteration"] for line in (out / "metrics.json").read_text().splitlines()] == [9, 19]
    assert not (out / LOCK_FILE).exists()


def test_resuming_a_finished_run_writes_nothing(tmp_path):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT]) == 0
    before = snapshot(out)
    assert cli([f"train.output_dir={out}", *SHORT, "--resume"]) == 0
    assert snapshot(out) == before


def test_resume_with_another_max_iter_warns(tmp_path, treadle_caplog):
    out = tmp_path / "run"
    assert cli([f"train.output_dir={out}", *SHORT, "train.max_iter=20"]) == 0
    assert cli([f"train.output_dir={out}", *SHORT, "--resume"]) == 0
    assert "Resuming a run of max_iter=20 with max_iter=40" in treadle_caplog.text


def test_move_aside_refuses_the_current_directory(tmp_path, monkeypatch):
    from treadle.utils.run_folder import RunFolderError

    (tmp_path / "metrics.json").write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    folder = RunFolder(".")
    with pytest.raises(RunFolderError, match="holds the current directory"):
        folder.claim(resume=False, move_aside=True)
    assert sorted(os.listdir(tmp_path)) == ["metrics.json"]


def _left_by_a_killed_job(out: Path) -> None:
    """The lock a job killed with -9 leaves: its record, no process holding it."""
    (out / LOCK_FILE).write_text(json.dumps({"pid": 4_000_000, "host": socket.gethostname(), "started": "2026-01-01"})
                                 + "\n")


def test_a_refused_fresh_start_changes_nothing_in_the_folder_a_killed_jobs_lock_included(tmp_path):
    from treadle.checkpoint import CheckpointError

    out = tmp_path / "run"
    _tiny_trainer(out).train()
    _left_by_a_killed_job(out)
    before = snapshot(out)
    assert LOCK_FILE in before
    with pytest.raises(RunFolderUsedError, match="holds an earlier run"):
        _tiny_trainer(out).train()
    assert snapshot(out) == before
    # A resume whose checkpoint does not fit (another model) is refused before the claim too.
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(5)]
    other = Trainer(torch.nn.Linear(3, 5), "sgd", DataLoader(data, batch_size=None), lr=0.1,
                    loss_fn=torch.nn.functional.cross_entropy, max_epochs=2, output_dir=str(out), progress_bar=False)
    with pytest.raises(CheckpointError, match="Cannot resume from"):
        other.train(resume=True)
    assert snapshot(out) == before
    # train_net's refusal too: the folder is checked before anything is written.
    assert cli([f"train.output_dir={out}", *SHORT]) == 2
    assert snapshot(out) == before
    # The resume that is accepted takes the lock over, and releases it at the end.
    _tiny_trainer(out).train(resume=True)
    assert not (out / LOCK_FILE).exists()


def test_trainer_resume_from_a_checkpoint_of_another_model_is_refused_before_loading(tmp_path):
    from treadle.checkpoint import CheckpointError

    _tiny_trainer(tmp_path / "a").train()
    data = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(5)]  # ready batches
    other = Trainer(torch.nn.Linear(3, 5), "sgd", DataLoader(data, batch_size=None), lr=0.1, loss_fn=torch.nn.functional.cross_entropy,
                    max_epochs=2, progress_bar=False)
    weights = {k: v.clone() for k, v in other.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"2 of different shapes \(weight: checkpoint \(2, 3\), model \(5, 3\)"):
        other.train(resume=str(tmp_path / "a" / "model_final.pth"))
    assert all(torch.equal(weights[k], v) for k, v in other.model.state_dict().items())  # nothing was loaded
