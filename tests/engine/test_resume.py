"""Exact resume: a job killed at any moment and resumed ends as if never interrupted.

The job is ``tests/resume_job.py`` (dropout, a shuffled map-style dataset
with random augmentation read by data workers, SGD with momentum, a step
learning-rate schedule, periodic checkpoints with keep-last-N, preemption
handling, metrics.json and TensorBoard writers). The slow tests run it in
subprocesses and kill it; the others run it in this process
(``num_workers=0``, which yields the same batches thanks to per-sample seeding).
"""

import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import resume_job
from treadle.checkpoint import UnsafeCheckpointError
from tests.zip_records import flip_bit, record_span, tensor_record
from treadle.hooks import PREEMPTED_EXIT_CODE, CallbackHook

JOB = Path(resume_job.__file__)
# The subprocess runs: long enough that eleven kills, each after a few
# iterations, leave work for the final run.
N_ITERS = 120
# The in-process runs.
N_SMALL = 20
POLL_SECONDS = 0.0005
WAIT_SECONDS = 120  # generous upper bound on one launch; only reached when something hangs


# ---------------------------------------------------------------- helpers
def final_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "model_final.pth", map_location="cpu", weights_only=True)


def assert_bit_identical(a: dict, b: dict) -> None:
    """Same weights, optimizer state, schedule, data position and RNG, tensor for tensor."""
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"model weight {key} differs"
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert state_a.keys() == state_b.keys()
    for index in state_a:
        assert torch.equal(state_a[index]["momentum_buffer"], state_b[index]["momentum_buffer"]), index
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    trainer_a, trainer_b = a["trainer"], b["trainer"]
    assert trainer_a["hooks"]["LRScheduler"] == trainer_b["hooks"]["LRScheduler"]
    assert trainer_a["step"]["data"] == trainer_b["step"]["data"]
    assert torch.equal(trainer_a["rng"]["torch"], trainer_b["rng"]["torch"])
    assert a["iteration"] == b["iteration"]


def read_metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.json").read_text().splitlines()]


def iterations(lines: list) -> list:
    return [line["iteration"] for line in lines]


def deterministic(lines: list) -> list:
    """What must be equal between runs: the loss and learning rate of each line (not timings)."""
    return [(line["iteration"], line["total_loss"], line["lr"]) for line in lines]


def tensorboard_points(run_dir: Path, tag: str) -> list:
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(event.step, event.value) for event in acc.Scalars(tag)]


def hidden_files(run_dir: Path) -> list:
    return sorted(name for name in os.listdir(run_dir) if name.startswith("."))


def checkpoint_files(run_dir: Path) -> list:
    """What a job leaves in its directory, without the TensorBoard event files (named by time and pid)."""
    return sorted(name for name in os.listdir(run_dir) if not name.startswith("events.out.tfevents."))


def run_here(run_dir: Path, max_iter: int, **kwargs) -> resume_job.Job:
    """Runs the job in this process with num_workers=0, restoring the thread count it changes."""
    threads = torch.get_num_threads()
    try:
        return resume_job.run(str(run_dir), max_iter, num_workers=0, **kwargs)
    finally:
        torch.set_num_threads(threads)


def messages(caplog, level=logging.INFO) -> list:
    return list(dict.fromkeys(r.getMessage() for r in caplog.records if r.levelno >= level))


class Launch:
    """One run of resume_job.py in a subprocess; its output goes to a log file."""

    def __init__(self, run_dir: Path, max_iter: int, log: Path, *args: str) -> None:
        self.log = log
        cmd = [sys.executable, str(JOB), "--output-dir", str(run_dir), "--max-iter", str(max_iter), *args]
        with open(log, "wb") as out:
            # A session of its own: signals go to the job's process group, the
            # data workers included, as a scheduler's would.
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"resume_job.py did not finish in {WAIT_SECONDS} s; its output:\n{self.output()[-3000:]}")

    def wait_until(self, condition, what: str) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"resume_job.py exited with status {self.proc.returncode} before {what}; "
                    f"its output:\n{self.output()[-3000:]}"
                )
            if time.monotonic() > deadline:
                self.signal(signal.SIGKILL)
                pytest.fail(f"timed out waiting until {what}; output:\n{self.output()[-3000:]}")
            time.sleep(POLL_SECONDS)

    def signal(self, signum: int) -> None:
        os.killpg(self.proc.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        assert self.wait() == -signal.SIGKILL, f"the job ended on its own before the kill:\n{self.output()[-3000:]}"


def progress(path: Path) -> list:
    """Iterations the job started, from its progress file (complete lines only)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [int(x) for x in text.split("\n")[:-1]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted subprocess run to N_ITERS, the standard for the killed ones."""
    run_dir = tmp_path_factory.mktemp("reference")
    launch = Launch(run_dir, N_ITERS, run_dir.parent / "reference.log")
    assert launch.wait() == 0, launch.output()[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def small_reference(tmp_path_factory) -> Path:
    """An uninterrupted in-process run to N_SMALL."""
    run_dir = tmp_path_factory.mktemp("small_reference")
    run_here(run_dir, N_SMALL)
    return run_dir


# ---------------------------------------------------------------- kill -9 at random moments
@pytest.mark.slow
def test_exact_resume_after_sigkill_at_random_moments(reference, tmp_path):
    rng = random.Random(20240611)
    run_dir = tmp_path / "run"
    # Eleven kills: eight at random moments a few iterations in, three at
    # the edges of a checkpoint save: before the file's rename, between the
    # file's rename and the pointer's, and right after the pointer's (before
    # the hooks after the checkpointer, the writers, have run).
    plan = ["random", "random", "in_save:checkpoint", "random", "in_save:pointer", "random"]
    plan += ["in_save:after-pointer", "random", "random", "random", "random"]
    for n, kind in enumerate(plan):
        progress_file = tmp_path / f"progress_{n}"
        args = ["--resume", "--progress-file", str(progress_file)]
        marker = tmp_path / f"marker_{n}"
        if kind.startswith("in_save:"):
            args += ["--pause-in-save-marker", str(marker), "--pause-on", kind.split(":")[1]]
        launch = Launch(run_dir, N_ITERS, tmp_path / f"launch_{n}.log", *args)

        if kind == "random":
            # A random number of iterations in, then a random fraction of an
            # iteration more (measured from the last one): anywhere in the
            # step, a hook, a save or a write.
            started = rng.randint(2, 7)
            seen, changed_at, durations = 0, time.monotonic(), []
            def enough(progress_file=progress_file, durations=durations, started=started) -> bool:
                nonlocal seen, changed_at
                count = len(progress(progress_file))
                if count != seen:
                    now = time.monotonic()
                    if seen:
                        durations.append(now - changed_at)
                    seen, changed_at = count, now
                return count >= started
            launch.wait_until(enough, f"{started} iterations started")
            time.sleep(rng.uniform(0.0, 1.5) * min(durations[-1] if durations else 0.005, 0.05))
        else:
            launch.wait_until(marker.exists, "the save paused")
        launch.kill()

        names = hidden_files(run_dir)
        if kind == "in_save:checkpoint":
            # The new file is written but not renamed: a temporary file is all there is of it.
            assert any(re.fullmatch(rf"\.model_\d{{7}}\.pth\.tmp\.{launch.pid}\.[0-9a-f]{{8}}", n) for n in names), names
        if kind == "in_save:pointer":
            # The new checkpoint is in place but last_checkpoint still names the previous one.
            assert any(n.startswith(f".last_checkpoint.tmp.{launch.pid}.") for n in names), names
            numbered = sorted(n for n in os.listdir(run_dir) if re.fullmatch(r"model_\d{7}\.pth", n))
            assert (run_dir / "last_checkpoint").read_text() == numbered[-2], numbered
        if kind == "in_save:after-pointer":
            # The save is complete; its iteration's metrics were written before it.
            pointer = (run_dir / "last_checkpoint").read_text()
            saved = int(re.fullmatch(r"model_(\d{7})\.pth", pointer).group(1))
            assert iterations(read_metrics(run_dir))[-1] == saved

    final = Launch(run_dir, N_ITERS, tmp_path / "final.log", "--resume")
    assert final.wait() == 0, final.output()[-3000:]

    # Weights, optimizer state, schedule, data position and RNG: bit-identical.
    assert_bit_identical(final_state(run_dir), final_state(reference))

    # metrics.json: every iteration exactly once, with the uninterrupted run's losses and rates.
    lines, expected = read_metrics(run_dir), read_metrics(reference)
    assert iterations(lines) == list(range(N_ITERS))
    assert deterministic(lines) == deterministic(expected)

    # TensorBoard, read as TensorBoard reads it: each step once, same values.
    for tag in ("total_loss", "lr"):
        points = tensorboard_points(run_dir, tag)
        assert [step for step, _ in points] == list(range(N_ITERS)), tag
        assert points == tensorboard_points(reference, tag), tag

    # The same files as the uninterrupted run: keep-last-N held, and every
    # temporary file of a killed save was removed by a later save's prune.
    assert checkpoint_files(run_dir) == checkpoint_files(reference)
    assert hidden_files(run_dir) == []


@pytest.mark.slow
def test_kill_9_with_the_flush_deferred_then_resume_leaves_every_iteration_once(reference, tmp_path):
    """With PeriodicWriter(defer=True) the rows of each flush are written at
    the next one: a kill -9 loses the rows after the last checkpoint, as it
    does with a flush that waits, and the resumed run writes them again."""
    run_dir, progress_file = tmp_path / "run", tmp_path / "progress"
    for attempt, started in enumerate((8, 25)):
        launch = Launch(run_dir, N_ITERS, tmp_path / f"killed{attempt}.log", "--defer",
                        "--progress-file", str(progress_file), *(["--resume"] if attempt else []))
        launch.wait_until(lambda n=started: len(progress(progress_file)) >= n, f"{started} iterations started")
        launch.kill()
    final = Launch(run_dir, N_ITERS, tmp_path / "final.log", "--defer", "--resume")
    assert final.wait() == 0, final.output()[-3000:]
    lines = read_metrics(run_dir)
    assert iterations(lines) == list(range(N_ITERS))
    assert deterministic(lines) == deterministic(read_metrics(reference))
    assert_bit_identical(final_state(run_dir), final_state(reference))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["file", "dcp"])
def test_kill_9_during_a_background_save_resumes_exactly_from_the_previous_checkpoint(reference, tmp_path, fmt):
    """Killed while a background save is in flight (its file written, or its
    DCP directory complete, but not yet renamed into place): the previous
    checkpoint is the resume point and the run ends bit-identical."""
    from treadle.checkpoint import sharded

    options = ("--async-save", "--format", fmt)
    if fmt == "dcp":
        reference = tmp_path / "reference"
        straight = Launch(reference, N_ITERS, tmp_path / "reference.log", *options)
        assert straight.wait() == 0, straight.output()[-3000:]
    run_dir = tmp_path / "run"
    progress_file = tmp_path / "progress"
    first = Launch(run_dir, N_ITERS, tmp_path / "first.log", *options, "--progress-file", str(progress_file))
    first.wait_until(
        lambda: len(progress(progress_file)) >= 7 and (run_dir / "last_checkpoint").exists(),
        "7 iterations started and a checkpoint written",
    )
    first.kill()
    before = (run_dir / "last_checkpoint").read_text()
    assert before.endswith(".dcp" if fmt == "dcp" else ".pth")

    # The first background save of the resumed job stops before its file (or
    # directory) is renamed into place; training goes on meanwhile, and the job is killed.
    marker = tmp_path / "paused"
    # The killed job may have renamed its own save of the checkpoint the
    # resumed job pauses in (the kill fell between that rename and the
    # pointer's): such a leftover is the first job's, unchanged below.
    left = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.iterdir()}
    second = Launch(
        run_dir, N_ITERS, tmp_path / "second.log", "--resume", *options,
        "--pause-in-save-marker", str(marker), "--pause-on", "checkpoint",
    )
    second.wait_until(lambda: marker.exists() and "\n" in marker.read_text(), "the background save paused")
    in_flight = marker.read_text().split(" -> ")[1].strip()
    second.kill()
    assert (run_dir / "last_checkpoint").read_text() == before
    published = Path(in_flight)
    assert not published.exists() or (
        left.get(published.name) == (published.stat().st_mtime_ns, published.stat().st_size)
    ), "the checkpoint of the save in flight never appeared"

    final = Launch(run_dir, N_ITERS, tmp_path / "final.log", "--resume", *options)
    assert final.wait() == 0, final.output()[-3000:]
    assert f"Resuming from {run_dir / before}" in final.output()
    if fmt == "dcp":
        as_file = lambda d: sharded.dcp_to_file_state(sharded.read_dcp(str(d / "model_final.dcp")))  # noqa: E731
        assert_bit_identical(as_file(run_dir), as_file(reference))
    else:
        assert_bit_identical(final_state(run_dir), final_state(reference))
    lines, expected = read_metrics(run_dir), read_metrics(reference)
    assert iterations(lines) == list(range(N_ITERS))
    assert deterministic(lines) == deterministic(expected)
    assert checkpoint_files(run_dir) == checkpoint_files(reference)


# ---------------------------------------------------------------- SIGTERM
@pytest.mark.slow
def test_sigterm_checkpoints_within_an_iteration_and_exits_75(reference, tmp_path):
    run_dir = tmp_path / "run"
    progress_file = tmp_path / "progress"
    # A writer period longer than the run: metrics reach the file only through
    # the flushes around checkpoints and the after_train flush.
    launch = Launch(
        run_dir, N_ITERS, tmp_path / "launch.log", "--progress-file", str(progress_file), "--log-period", "1000"
    )
    launch.wait_until(lambda: len(progress(progress_file)) >= 10, "10 iterations started")
    # Frozen, the job cannot advance between reading its iteration and the
    # signal. SIGTERM goes to the whole process group, data workers included.
    launch.signal(signal.SIGSTOP)
    running = progress(progress_file)[-1]
    launch.signal(signal.SIGTERM)
    launch.signal(signal.SIGCONT)
    assert launch.wait() == PREEMPTED_EXIT_CODE, launch.output()[-3000:]

    # The checkpoint is of the iteration running at the signal, or of the next
    # one when the signal came after the handler's check in that iteration.
    pointer = (run_dir / "last_checkpoint").read_text()
    saved = int(re.fullmatch(r"model_(\d{7})\.pth", pointer).group(1))
    assert running <= saved <= running + 1, (running, pointer)
    checkpoint = torch.load(run_dir / pointer, weights_only=True)
    assert checkpoint["iteration"] == saved == checkpoint["trainer"]["iteration"]
    assert checkpoint["trainer"]["step"]["data"]["position"] == (saved + 1) * resume_job.BATCH_SIZE
    assert progress(progress_file)[-1] == saved  # no iteration ran after the saved one
    # Not finished: no model_final, which would claim the run is complete.
    assert not (run_dir / "model_final.pth").exists()
    # after_train ran for every hook: the writers wrote what an uninterrupted run had by then, up to
    # the last flush (before the periodic checkpoints, every 3); the resumed run writes the rest.
    last_flush = max(i for i in range(saved + 1) if (i + 1) % 3 == 0)
    assert iterations(read_metrics(run_dir))[-1] == last_flush
    assert [step for step, _ in tensorboard_points(run_dir, "total_loss")][-1] == last_flush
    assert "Received SIGTERM: saving a checkpoint at iteration" in launch.output()

    resumed = Launch(run_dir, N_ITERS, tmp_path / "resumed.log", "--resume", "--log-period", "1000")
    assert resumed.wait() == 0, resumed.output()[-3000:]
    assert f"training from iteration {saved + 1} to {N_ITERS}" in resumed.output()
    assert_bit_identical(final_state(run_dir), final_state(reference))


def test_preemption_exits_only_after_every_hook_finished(tmp_path):
    """In-process: SIGUSR1 at iteration 4; the writers (after PreemptionHandler) still flush and close."""
    signal_at = CallbackHook(before_step=lambda t: os.kill(os.getpid(), signal.SIGUSR1) if t.iter == 4 else None)
    threads, previous_handler = torch.get_num_threads(), signal.getsignal(signal.SIGUSR1)
    try:
        torch.set_num_threads(1)
        resume_job.seed_all_rng(resume_job.SEED)
        job = resume_job.build_job(str(tmp_path), num_workers=0, log_period=1000, extra_hooks=[signal_at])
        # Registered after the writers, so after PreemptionHandler, which ends the process.
        finished = []
        job.trainer.register_hooks([CallbackHook(after_train=lambda t: finished.append(t.iter))])
        with pytest.raises(SystemExit) as info:
            job.trainer.train(0, N_SMALL)
    finally:
        torch.set_num_threads(threads)
    assert info.value.code == PREEMPTED_EXIT_CODE
    assert finished == [5]  # the last hook's after_train ran (after iteration 4) before the exit
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000004.pth"
    assert not (tmp_path / "model_final.pth").exists()
    # Line 2 from the flush before the periodic checkpoint; none of the preemption's own at 4: an
    # uninterrupted run has none there, and the resumed run writes 3 and 4's values in its next line.
    assert iterations(read_metrics(tmp_path)) == [2]
    assert signal.getsignal(signal.SIGUSR1) == previous_handler  # restored in after_train


def test_preemption_at_a_periodic_save_does_not_write_it_twice(tmp_path):
    signal_at = CallbackHook(before_step=lambda t: os.kill(os.getpid(), signal.SIGTERM) if t.iter == 5 else None)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        resume_job.seed_all_rng(resume_job.SEED)
        job = resume_job.build_job(str(tmp_path), num_workers=0, extra_hooks=[signal_at])
        saved = []
        real_save = job.checkpointer.save
        job.checkpointer.save = lambda name, **kw: saved.append(name) or real_save(name, **kw)
        with pytest.raises(SystemExit) as info:
            job.trainer.train(0, N_SMALL)
    finally:
        torch.set_num_threads(threads)
    assert info.value.code == PREEMPTED_EXIT_CODE
    # Period 3: the periodic saves of 2 and 5; the preemption at 5 reuses the latter.
    assert saved == ["model_0000002", "model_0000005"]
    assert (tmp_path / "last_checkpoint").read_text() == "model_0000005.pth"


# ---------------------------------------------------------------- damaged and hostile checkpoints
def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_a_weight_bit(path: Path) -> None:
    """One bit inside the stored bytes of the first layer's weights: torch.load alone would not notice."""
    weight = torch.load(path, weights_only=True)["model"]["net.0.weight"]
    offset, size = record_span(path, tensor_record(path, weight))
    flip_bit(path, offset + size // 3, bit=5)


@pytest.mark.parametrize(
    "damage, reported",
    [(truncate, "truncated or corrupt"), (flip_a_weight_bit, "is corrupt: the checksum")],
    ids=["truncated", "flipped_bit"],
)
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    small_reference, tmp_path, treadle_caplog, damage, reported
):
    with pytest.raises(RuntimeError, match="simulated crash at iteration 8"):
        run_here(tmp_path, N_SMALL, fail_at=8)
    # Checkpoints at 2 and 5 (period 3); the crash at 8 came before the save of 8.
    newest = tmp_path / "model_0000005.pth"
    assert checkpoint_files(tmp_path) == ["last_checkpoint", "metrics.json", "model_0000002.pth", "model_0000005.pth"]
    damage(newest)

    treadle_caplog.clear()
    run_here(tmp_path, N_SMALL, resume=True)

    warnings = messages(treadle_caplog, logging.WARNING)
    assert any(f"Cannot resume from {newest}" in w and reported in w for w in warnings), warnings
    assert any("model_0000002.pth, an older checkpoint" in w for w in warnings), warnings
    assert "Starting training from iteration 3" in messages(treadle_caplog)
    assert_bit_identical(final_state(tmp_path), final_state(small_reference))
    lines = read_metrics(tmp_path)
    assert iterations(lines) == list(range(N_SMALL))
    assert deterministic(lines) == deterministic(read_metrics(small_reference))


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code from the checkpoint ran"))


def test_malicious_newest_checkpoint_stops_the_resume(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_here(tmp_path, N_SMALL, fail_at=4)
    marker = tmp_path / "marker"
    evil = tmp_path / "model_0000005.pth"
    good = torch.load(tmp_path / "model_0000002.pth", weights_only=True)
    torch.save({**good, "iteration": 5, "payload": _Payload(str(marker))}, evil)
    (tmp_path / "last_checkpoint").write_text(evil.name)

    resume_job.seed_all_rng(resume_job.SEED)
    job = resume_job.build_job(str(tmp_path), num_workers=0)
    fresh = {k: v.clone() for k, v in job.model.state_dict().items()}
    with pytest.raises(UnsafeCheckpointError, match=re.escape(f"Refusing to load checkpoint '{evil}'")):
        job.checkpointer.resume_or_load("", resume=True)
    assert not marker.exists()
    # Not even partly loaded, and no fall-back to the older file: a person decides.
    assert job.trainer.iter == 0
    assert all(torch.equal(v, fresh[k]) for k, v in job.model.state_dict().items())


# ---------------------------------------------------------------- keep-last-N, longer runs, finished runs
def test_keep_last_two_holds_across_a_restart(tmp_path):
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_here(tmp_path, 14, checkpoint_period=2, fail_at=8)
    # Saves at 1, 3, 5, 7; the crash came at 8, before its save.
    assert checkpoint_files(tmp_path) == ["last_checkpoint", "metrics.json", "model_0000005.pth", "model_0000007.pth"]
    # What a save killed by another process leaves behind.
    leftover = tmp_path / ".model_0000009.pth.tmp.999999999.0badf00d"
    leftover.write_bytes(b"half a checkpoint")

    run_here(tmp_path, 14, checkpoint_period=2, resume=True)
    # Saves at 9 and 11 (13 is the last iteration: model_final instead); the
    # files of the first run count towards the limit, the leftover is removed.
    assert checkpoint_files(tmp_path) == [
        "last_checkpoint",
        "metrics.json",
        "model_0000009.pth",
        "model_0000011.pth",
        "model_final.pth",
    ]
    assert (tmp_path / "last_checkpoint").read_text() == "model_final.pth"
    assert hidden_files(tmp_path) == []


def test_resume_with_a_larger_max_iter_continues_to_the_new_end(small_reference, tmp_path, treadle_caplog):
    run_here(tmp_path, 12)
    assert final_state(tmp_path)["iteration"] == 11
    treadle_caplog.clear()
    run_here(tmp_path, N_SMALL, resume=True)
    assert "Starting training from iteration 12" in messages(treadle_caplog)
    # A torch StepLR does not depend on max_iter: the result is the 20-iteration run's.
    assert_bit_identical(final_state(tmp_path), final_state(small_reference))
    lines = read_metrics(tmp_path)
    assert deterministic(lines) == deterministic(read_metrics(small_reference))


def test_resuming_a_finished_run_says_so_and_writes_nothing(small_reference, tmp_path, treadle_caplog):
    run_here(tmp_path, N_SMALL)
    before = {name: ((tmp_path / name).read_bytes(), os.stat(tmp_path / name).st_mtime_ns) for name in os.listdir(tmp_path)}
    treadle_caplog.clear()
    job = run_here(tmp_path, N_SMALL, resume=True)
    logged = messages(treadle_caplog)
    assert any(
        m.startswith(f"Nothing to train: the run starts at iteration {N_SMALL} and max_iter is {N_SMALL}")
        and "finished already" in m
        for m in logged
    ), logged
    assert not any(m.startswith("Starting training") for m in logged)
    after = {name: ((tmp_path / name).read_bytes(), os.stat(tmp_path / name).st_mtime_ns) for name in os.listdir(tmp_path)}
    assert after == before  # no file written, rewritten or added
    # The loaded model is the finished run's.
    final = final_state(small_reference)["model"]
    assert all(torch.equal(v, final[k]) for k, v in job.model.state_dict().items())


# ---------------------------------------------------------------- writers after resume
def test_metrics_json_after_resume_keeps_no_line_of_the_interrupted_run_past_the_checkpoint(
    small_reference, tmp_path
):
    # Run 1: checkpoints at 3 and 7 (period 4), a crash in iteration 9. The
    # writers flush in after_train, also after an error, so lines 0-9 are written.
    with pytest.raises(RuntimeError, match="simulated crash at iteration 9"):
        run_here(tmp_path, N_SMALL, checkpoint_period=4, fail_at=9)
    assert iterations(read_metrics(tmp_path)) == list(range(10))

    # Run 2 resumes at 8 and crashes in iteration 8: its writers dropped lines
    # 8 and 9 of run 1 when it started and wrote its own 8, so 9 is gone.
    with pytest.raises(RuntimeError, match="simulated crash at iteration 8"):
        run_here(tmp_path, N_SMALL, checkpoint_period=4, resume=True, fail_at=8)
    assert iterations(read_metrics(tmp_path)) == list(range(9))

    # Run 3 finishes: every iteration once, with the uninterrupted run's values.
    run_here(tmp_path, N_SMALL, checkpoint_period=4, resume=True)
    lines = read_metrics(tmp_path)
    assert iterations(lines) == list(range(N_SMALL))
    assert deterministic(lines) == deterministic(read_metrics(small_reference))
    assert_bit_identical(final_state(tmp_path), final_state(small_reference))
