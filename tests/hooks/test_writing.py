"""PeriodicWriter: when it writes the storage to its writers."""

import json

import pytest
import torch
import torch.nn.functional as F

from tests import resume_job
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.engine.test_hook_table import train
from tests.hooks.helpers import make_run, read_lines
from treadle.engine import EagerStep, TrainerBase
from treadle.events import storage as storage_module
from treadle.events import EventWriter, JSONWriter, ScalarKind, TensorboardWriter, get_event_storage
from treadle.hooks import (
    PREEMPTED_EXIT_CODE,
    BestCheckpointer,
    CallbackHook,
    EarlyStopping,
    EvalHook,
    IterationTimer,
    LRMonitor,
    PeriodicCheckpointer,
    PeriodicWriter,
)


def test_periodic_writer_writes_at_its_period_and_at_the_last_iteration():
    written = []

    class Recording(EventWriter):
        def write(self):
            written.append(hook.trainer.iter)

    hook = PeriodicWriter([Recording()], period=4)
    train(hook)
    assert written[:3] == [3, 7, 9]


# ---------------------------------------------------------------- deferred flush
def _rows(run_dir):
    """metrics.json's rows without the timings (which differ between runs)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.json").read_text().splitlines()]
    return [{k: v for k, v in line.items() if not k.endswith("time")} for line in lines]


def _run(run_dir, max_iter, **kwargs):
    threads = torch.get_num_threads()
    try:
        return resume_job.run(str(run_dir), max_iter, num_workers=0, checkpoint_period=7, log_period=5, **kwargs)
    finally:
        torch.set_num_threads(threads)


def _published_run(path, defer):
    """A run whose hooks put a tensor every iteration, an evaluation result
    every 6 and read the storage every 7 (which records values between two
    flushes), written every 5 iterations with medians over 20."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(4)]
    trainer = TrainerBase(EagerStep(model, data, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=F.cross_entropy))

    def publish(trainer):
        storage, it = trainer.storage, trainer.iter
        storage.put_scalar("score", torch.tensor(float(it % 7)))
        storage.put_scalar("rate", 0.5 * it, smoothing_hint=False)
        if it % 6 == 5:
            storage.put_scalar("accuracy", it / 100, kind=ScalarKind.METRIC)
        if it % 7 == 3:
            storage.latest()

    writer = JSONWriter(str(path / "metrics.json"), window_size=20)
    trainer.register_hooks([CallbackHook(after_step=publish), PeriodicWriter([writer], period=5, defer=defer)])
    trainer.train(0, 43)
    return _rows(path)


@pytest.mark.parametrize("one_by_one", [True, False])
def test_a_deferred_flush_writes_every_row_of_a_waiting_one_once_and_in_order(tmp_path, monkeypatch, one_by_one):
    # one_by_one=False: CPU tensors take the accelerators' path (stacked, one copy per device).
    monkeypatch.setattr(storage_module, "_READ_CPU_TENSORS_ONE_BY_ONE", one_by_one)
    (tmp_path / "waits").mkdir()
    (tmp_path / "defers").mkdir()
    waiting = _published_run(tmp_path / "waits", defer=False)
    deferred = _published_run(tmp_path / "defers", defer=True)
    assert deferred == waiting
    iterations = [row["iteration"] for row in waiting]
    assert iterations == sorted(set(iterations))
    # Every period's row, each evaluation at its own iteration, the last iteration's at the end.
    assert [4, 5, 9, 11, 14, 17] == iterations[:6] and iterations[-1] == 42
    assert {row["iteration"] for row in waiting if "accuracy" in row} == {5, 11, 17, 23, 29, 35, 41}


def _tensorboard(run_dir):
    """Every TensorBoard scalar as ``{tag: [(step, value)]}``, read as TensorBoard reads it."""
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _without_timings(rows):
    """Each row's values, its timings left out (which differ between runs; their keys do not)."""
    return [{k: v for k, v in row.items() if not k.endswith("time")} for row in rows]


def _evaluated_run(out, log_period, eval_period, checkpoint_period, defer):
    """30 iterations with an evaluation every ``eval_period``, a best checkpoint
    and early stopping reading its result from the storage at once, periodic
    checkpoints (each flushes the writers) and metrics.json and TensorBoard
    written every ``log_period``; returns both files' contents and the last
    iteration trained."""
    # Improves until iteration 14, then worsens: early stopping ends some runs early.
    score = lambda: {"acc": 1.0 - abs(run.trainer.iter - 14) / 100}  # noqa: E731
    writers = lambda r: PeriodicWriter(  # noqa: E731
        [JSONWriter(str(r.out / "metrics.json"), window_size=4), TensorboardWriter(str(r.out), window_size=4)],
        period=log_period,
        defer=defer,
    )
    run = make_run(
        out,
        lambda r: IterationTimer(warmup_iter=0),
        lambda r: LRMonitor(r.optimizer),
        lambda r: EvalHook(eval_period, score),
        lambda r: BestCheckpointer(eval_period, r.checkpointer, "acc", "max"),
        lambda r: EarlyStopping("acc", patience=2),
        lambda r: PeriodicCheckpointer(r.checkpointer, period=checkpoint_period) if checkpoint_period else CallbackHook(),
        writers,
    )
    run.trainer.train(0, 30)
    return read_lines(out / "metrics.json"), _tensorboard(out), max(it for it in run.weights if it != "final")


@pytest.mark.parametrize("log_period", [1, 3, 5])
@pytest.mark.parametrize("eval_period", [3, 5, 10])
@pytest.mark.parametrize("checkpoint_period", [0, 4, 10])
def test_a_deferred_flush_writes_every_row_whole_when_hooks_read_an_evaluation(
    tmp_path, log_period, eval_period, checkpoint_period
):
    # A best checkpoint and early stopping read the storage at an evaluation:
    # where that falls on a flush, the deferred flush's row must still hold
    # the iteration's training values (lr, total_loss, time, data_time).
    periods = (log_period, eval_period, checkpoint_period)
    waiting_rows, waiting_board, last = _evaluated_run(tmp_path / "waits", *periods, defer=False)
    deferred_rows, deferred_board, _ = _evaluated_run(tmp_path / "defers", *periods, defer=True)
    assert [sorted(row) for row in deferred_rows] == [sorted(row) for row in waiting_rows]
    assert _without_timings(deferred_rows) == _without_timings(waiting_rows)
    assert deferred_board.keys() == waiting_board.keys()
    for tag, points in waiting_board.items():
        assert [step for step, _ in deferred_board[tag]] == [step for step, _ in points], tag
        if not tag.endswith("time"):
            assert deferred_board[tag] == points, tag
    # Every training scalar at every flush (the period's, a checkpoint's, the last), evaluations and all.
    flushes = {last} | {
        it for it in range(last + 1) if (it + 1) % log_period == 0 or checkpoint_period and (it + 1) % checkpoint_period == 0
    }
    for key in ("lr", "total_loss", "time", "data_time"):
        assert {row["iteration"] for row in deferred_rows if key in row} == flushes, key
        assert [step for step, _ in deferred_board[key]] == sorted(flushes), key


def test_a_deferred_flush_leaves_the_rows_until_the_next_flush():
    written = []

    class Recording(EventWriter):
        def write(self):
            written.append((hook.trainer.iter, get_event_storage().latest()["x"][1]))

    hook = PeriodicWriter([Recording()], period=4, defer=True)
    train(CallbackHook(after_step=lambda t: t.storage.put_scalar("x", torch.tensor(1.0))), hook)
    # Nothing to write at the first flush (3); at each later one, the values of the flush before.
    assert written[:2] == [(7, 3), (9, 7)]
    # The end of training waits: the last values are written.
    assert written[-1] == (10, 9)


@pytest.mark.parametrize("defer", [False, True])
def test_after_an_exception_in_a_hook_every_row_up_to_it_is_written(tmp_path, defer):
    _run(tmp_path / "whole", 30)
    with pytest.raises(RuntimeError, match="simulated crash at iteration 17"):
        _run(tmp_path / "failed", 30, defer=defer, fail_at=17)
    expected = [row for row in _rows(tmp_path / "whole") if row["iteration"] < 17]
    assert _rows(tmp_path / "failed") == expected + [_rows(tmp_path / "failed")[-1]]
    assert _rows(tmp_path / "failed")[-1]["iteration"] == 17


@pytest.mark.parametrize("defer", [False, True])
def test_a_preemption_then_resume_leaves_the_rows_of_an_uninterrupted_run(tmp_path, defer):
    _run(tmp_path / "whole", 30)
    uninterrupted = _rows(tmp_path / "whole")
    with pytest.raises(SystemExit) as stopped:
        _run(tmp_path / "run", 30, defer=defer, preempt_at=12)
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    # At the stop: every row an uninterrupted run had written by then (4, 6, 9), none of its own at 12.
    assert _rows(tmp_path / "run") == [row for row in uninterrupted if row["iteration"] <= 12]
    _run(tmp_path / "run", 30, defer=defer, resume=True)
    assert _rows(tmp_path / "run") == uninterrupted
