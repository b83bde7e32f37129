"""IterationTimer: the ``time`` it publishes and the speed and time it logs after training."""

import logging
import time

import pytest

from treadle.engine import StepBase, TrainerBase
from treadle.hooks import HookBase, IterationTimer


@pytest.fixture
def clock(monkeypatch):
    """``time.perf_counter`` moves only when a step or hook made with
    :func:`_clocked_step` or :func:`_clocked_hook` says it took time."""
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    return now


def _clocked_step(clock, seconds_at):
    class Step(StepBase):
        def run_step(self):
            clock[0] += seconds_at(self.trainer.iter)

    return Step()


def _clocked_hook(clock, name, **seconds_per_stage):
    def spend(seconds):
        def stage(self):
            clock[0] += seconds

        return stage

    return type(name, (HookBase,), {stage: spend(s) for stage, s in seconds_per_stage.items()})()


@pytest.mark.parametrize("timer_first", [True, False])
def test_iteration_timer_times_before_step_hooks_and_step_only(clock, timer_first):
    """``time`` is the iteration from its start to the end of the step: the
    before_step hooks (1) and the step (10) count, the after_step hooks (5)
    do not, wherever the timer is registered."""
    timer, costly = IterationTimer(warmup_iter=0), _clocked_hook(clock, "Costly", before_step=1, after_step=5)
    trainer = TrainerBase(_clocked_step(clock, lambda it: 10))
    trainer.register_hooks([timer, costly] if timer_first else [costly, timer])
    trainer.train(0, 3)
    assert trainer.storage.history("time").values() == [(11.0, 0), (11.0, 1), (11.0, 2)]


def test_iteration_timer_counts_slow_first_steps_as_the_steps_not_the_hooks(clock, treadle_caplog):
    """A compilation in the first iterations is left out of ``time`` and of
    the speed, and is still the step's time in the summary: it said 2:10 on
    hooks where the hooks took 20 s."""
    trainer = TrainerBase(_clocked_step(clock, lambda it: 100 if it == 0 else 10))
    trainer.register_hooks([IterationTimer(), _clocked_hook(clock, "Costly", after_step=5)])
    with treadle_caplog.at_level(logging.INFO):
        trainer.train(0, 4)
    messages = [r.getMessage() for r in treadle_caplog.records]
    assert "Overall training speed: 2 iterations in 0:00:20 (10.0000 s / it)" in messages
    assert "Total training time: 0:02:30 (0:00:20 on hooks, outside the step)" in messages


def test_the_last_epochs_end_is_hook_time_not_taken_off_the_step(clock, treadle_caplog):
    """The run's last after_epoch runs in after_train, outside the loop: it
    was subtracted from the loop's time too (the step read 0 s, the hooks
    2:40 of a 2:40 run)."""
    trainer = TrainerBase(_clocked_step(clock, lambda it: 10))
    trainer.epoch_length = 2
    trainer.register_hooks([_clocked_hook(clock, "EpochEval", after_epoch=60), IterationTimer(warmup_iter=0)])
    with treadle_caplog.at_level(logging.INFO):
        trainer.train(0, 4)
    assert trainer.timings()["step"] == 40.0 and trainer.timings()["EpochEval.after_epoch"] == 120.0
    assert "Total training time: 0:02:40 (0:02:00 on hooks, outside the step)" in [r.getMessage() for r in treadle_caplog.records]
