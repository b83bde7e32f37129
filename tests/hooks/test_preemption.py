"""PreemptionHandler: a checkpoint at the iteration's end, and an error after the stop."""

import os
import signal

import pytest

from tests.hooks.helpers import crash_at, make_run
from treadle.hooks import (
    CallbackHook,
    PreemptionHandler,
)


def test_an_error_after_a_preemption_stop_propagates_and_every_after_train_runs(tmp_path, treadle_caplog):
    """A hook crashing in the iteration where the preemption was asked for: the
    crash wins over the exit, and that failed iteration is not checkpointed (the
    checkpoint waits for the iteration's end, which never comes)."""
    previous_handler = signal.getsignal(signal.SIGUSR1)
    finished = []
    run = make_run(
        tmp_path,
        lambda r: CallbackHook(before_step=lambda t: os.kill(os.getpid(), signal.SIGUSR1) if t.iter == 2 else None),
        lambda r: PreemptionHandler(r.checkpointer),
        lambda r: crash_at(2),  # after PreemptionHandler: the stop is already requested
        lambda r: CallbackHook(after_train=lambda t: finished.append(t.iter)),
    )
    with pytest.raises(RuntimeError, match="crash at 2"):
        run.trainer.train(0, 10)
    assert run.trainer.stop_reason is None
    assert finished == [2]  # the hook after PreemptionHandler still closed up
    # The handler itself saw the error and did not try to exit.
    assert "PreemptionHandler.after_train failed" not in treadle_caplog.text
    assert "Exiting with status" not in treadle_caplog.text
    assert not (tmp_path / "model_0000002.pth").exists()
    assert signal.getsignal(signal.SIGUSR1) == previous_handler


def test_preemption_handler_reads_the_world_size_once_per_run_not_per_step(tmp_path, monkeypatch):
    from treadle.utils import comm

    calls = []
    real = comm.get_world_size
    monkeypatch.setattr(comm, "get_world_size", lambda *a, **k: calls.append(1) or real(*a, **k))

    def count(n_iter):
        run = make_run(tmp_path / str(n_iter), lambda r: PreemptionHandler(r.checkpointer))
        calls.clear()
        run.trainer.train(0, n_iter)
        return len(calls)

    assert count(2) == count(12)


@pytest.mark.parametrize("order", [("preemption", "checkpointer"), ("checkpointer", "preemption")])
def test_a_preemption_at_a_periodic_checkpoint_keeps_its_row_in_any_registration_order(tmp_path, order):
    """The periodic checkpointer's flush before its save writes the row of its
    iteration; registered before it, the handler used to save first with the
    stop's flush, which leaves that row to a resumed run that starts after it."""
    from treadle.events import JSONWriter
    from treadle.hooks import PeriodicCheckpointer, PeriodicWriter

    from tests.hooks.helpers import read_lines, same

    def make(out, *extra):
        factories = {
            "checkpointer": lambda r: PeriodicCheckpointer(r.checkpointer, 4),
            "preemption": lambda r: PreemptionHandler(r.checkpointer, exit_code=None),
        }
        writer = lambda r: PeriodicWriter([JSONWriter(str(out / "metrics.json"))], 3)  # noqa: E731
        return make_run(out, *extra, *[factories[name] for name in order], writer)

    def rows(out):
        return [(row["iteration"], row["total_loss"]) for row in read_lines(out / "metrics.json")]

    straight = make(tmp_path / "straight")
    straight.trainer.train(0, 12)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        sigterm_at_7 = CallbackHook(after_step=lambda t: t.iter == 7 and os.kill(os.getpid(), signal.SIGTERM))
        preempted = make(tmp_path / "run", lambda r: sigterm_at_7)
        preempted.trainer.train(0, 12)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert preempted.trainer.interrupted and preempted.pointer() == "model_0000007.pth"
    resumed = make(tmp_path / "run")
    resumed.trainer.train(resumed.resume(), 12)
    assert rows(tmp_path / "run") == rows(tmp_path / "straight")
    assert same(resumed.model.state_dict(), straight.model.state_dict())
