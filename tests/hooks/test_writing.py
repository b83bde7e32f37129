"""PeriodicWriter: when it writes the storage to its writers."""

import json

import pytest
import torch
import torch.nn.functional as F

from tests import resume_job
from tests.engine.test_hook_table import train
from treadle.engine import EagerStep, TrainerBase
from treadle.events import storage as storage_module
from treadle.events import EventWriter, JSONWriter, ScalarKind, get_event_storage
from treadle.hooks import PREEMPTED_EXIT_CODE, CallbackHook, PeriodicWriter


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
