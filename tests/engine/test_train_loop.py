import logging
import sys
import time

import pytest
import torch

from treadle.engine import HookBase, HookOrderError, StepBase, TrainerBase
from treadle.events import ScalarKind
from treadle.hooks.callback import CallbackHook

from tests.tiny_models import DeepForward, minor_faults


class RecordingStep(StepBase):
    def __init__(self, log, fail_at=None):
        self.log = log
        self.fail_at = fail_at

    def run_step(self):
        it = self.trainer.iter
        assert self.trainer.storage.iter == it
        self.log.append(("step", it))
        self.trainer.after_backward()
        if it == self.fail_at:
            raise ValueError(f"boom at {it}")
        self.storage.put_scalar("total_loss", torch.tensor(1.0), kind=ScalarKind.LOSS)


class Recorder(HookBase):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def before_train(self):
        self.log.append((self.name, "before_train", self.trainer.iter))

    def before_step(self):
        assert self.trainer.storage.iter == self.trainer.iter
        self.log.append((self.name, "before_step", self.trainer.iter))

    def after_backward(self):
        self.log.append((self.name, "after_backward", self.trainer.iter))

    def after_step(self):
        self.log.append((self.name, "after_step", self.trainer.iter))

    def after_train(self):
        self.log.append((self.name, "after_train", self.trainer.iter))


def make_trainer(log, hooks=(), fail_at=None, cls=TrainerBase):
    trainer = cls(RecordingStep(log, fail_at))
    trainer.register_hooks(hooks)
    return trainer


def test_hooks_run_in_order_around_each_step():
    log = []
    trainer = make_trainer(log, [Recorder("a", log), None, Recorder("b", log)])
    trainer.train(2, 4)
    expected = [("a", "before_train", 2), ("b", "before_train", 2)]
    for it in (2, 3):
        expected += [
            ("a", "before_step", it), ("b", "before_step", it),
            ("step", it),
            ("a", "after_backward", it), ("b", "after_backward", it),
            ("a", "after_step", it), ("b", "after_step", it),
        ]
    expected += [("a", "after_train", 4), ("b", "after_train", 4)]
    assert log == expected
    assert trainer.iter == 4 and trainer.start_iter == 2 and trainer.max_iter == 4


def test_after_train_runs_after_an_exception_which_is_logged_and_reraised(treadle_caplog):
    log = []
    trainer = make_trainer(log, [Recorder("a", log)], fail_at=1)
    with pytest.raises(ValueError, match="boom at 1"):
        trainer.train(0, 5)
    assert log[-1] == ("a", "after_train", 1)
    assert ("a", "after_step", 1) not in log
    assert "Exception during training at iteration 1" in treadle_caplog.text


class Failing(HookBase):
    def __init__(self, stage):
        self.stage = stage

    def after_step(self):
        if self.stage == "after_step" and self.trainer.iter == 2:
            raise RuntimeError("hook broke")

    def after_train(self):
        if self.stage == "after_train":
            raise RuntimeError("after_train broke")


def test_hook_exception_names_the_hook_and_later_after_train_still_run():
    log = []
    trainer = make_trainer(log, [Failing("after_step"), Failing("after_train"), Recorder("last", log)])
    with pytest.raises(RuntimeError, match="hook broke") as info:
        trainer.train(0, 5)
    assert info.value.treadle_origin == "hook Failing.after_step at iteration 2"  # what train_net prints, any Python
    if sys.version_info >= (3, 11):  # and a note under the traceback where Python has them (PEP 678)
        assert any("Failing.after_step at iteration 2" in note for note in info.value.__notes__)
    # The failing after_train of the second hook did not stop the third one's.
    assert log[-1] == ("last", "after_train", 2)


def test_system_exit_in_after_train_does_not_replace_the_error_nor_skip_later_hooks():
    """A hook ending the process in after_train (as PreemptionHandler does) while an error propagates."""

    class Exits(HookBase):
        def after_train(self):
            raise SystemExit(75)

    log = []
    trainer = make_trainer(log, [Failing("after_step"), Exits(), Recorder("last", log)])
    with pytest.raises(RuntimeError, match="hook broke"):
        trainer.train(0, 5)
    assert log[-1] == ("last", "after_train", 2)


def test_after_train_error_on_success_path_is_raised():
    trainer = make_trainer([], [Failing("after_train")])
    with pytest.raises(RuntimeError, match="after_train broke"):
        trainer.train(0, 2)


def test_request_stop_ends_after_the_current_step_and_runs_after_train():
    log = []
    stopper = CallbackHook(after_step=lambda t: t.request_stop("enough") if t.iter == 3 else None)
    trainer = make_trainer(log, [stopper, Recorder("r", log)])
    trainer.train(0, 100)
    steps = [e for e in log if e[0] == "step"]
    assert steps[-1] == ("step", 3)
    assert ("r", "after_step", 3) in log  # hooks after the stopper still see the step
    assert log[-1] == ("r", "after_train", 4)
    assert trainer.stop_reason == "enough"
    # A second train() starts without the old stop request.
    log.clear()
    trainer.train(4, 6)
    assert [e for e in log if e[0] == "step"] == [("step", 4), ("step", 5)]


class Counter(HookBase):
    state_attributes = ("count",)

    def __init__(self):
        self.count = 0

    def after_step(self):
        self.count += 1


def test_state_dict_round_trip_keeps_two_hooks_of_one_class_apart():
    a, b = Counter(), Counter()
    trainer = make_trainer([], [a, b])
    trainer.train(0, 3)
    b.count = 10
    state = trainer.state_dict()
    assert state["iteration"] == 2  # the last iteration run
    assert state["hooks"] == {"Counter": {"count": 3}, "Counter#2": {"count": 10}}

    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    state = trainer.state_dict()  # RNG state captured here

    c, d = Counter(), Counter()
    other = make_trainer([], [c, d])
    torch.rand(100)
    other.load_state_dict(state)
    assert (c.count, d.count, other.iter) == (3, 10, 2)
    assert torch.equal(torch.rand(3), expected_draw)


def test_state_for_an_unregistered_hook_is_reported(treadle_caplog):
    trainer = make_trainer([], [])
    trainer.load_state_dict({"iteration": 0, "hooks": {"Gone": {"x": 1}}})
    assert "state for hook 'Gone'" in treadle_caplog.text


class Producer(HookBase):
    pass


class Consumer(HookBase):
    runs_after = (Producer,)


def test_wrong_hook_order_is_reported():
    trainer = make_trainer([])
    with pytest.raises(HookOrderError, match=r"Consumer must be registered after Producer.*\[Consumer, Producer\]"):
        trainer.register_hooks([Consumer(), Producer()])
    trainer.register_hooks([Producer(), Consumer()])  # the right order is accepted
    assert [type(h) for h in trainer.hooks] == [Producer, Consumer]


def test_non_hook_is_rejected():
    with pytest.raises(TypeError, match="HookBase instances, got int"):
        make_trainer([]).register_hooks([3])


class Slow(HookBase):
    def after_step(self):
        time.sleep(0.005)


def test_timing_table_lists_the_step_and_the_hooks_above_one_percent(treadle_caplog):
    trainer = make_trainer([], [Counter(), Slow()])
    trainer.train(0, 5)
    timings = trainer.timings()
    assert set(timings) == {"step", "Counter.after_step", "Slow.after_step"}
    info = "\n".join(r.getMessage() for r in treadle_caplog.records if r.levelno == logging.INFO)
    assert "| Slow.after_step" in info and "| step" in info and "per iteration (ms)" in info
    assert "| Counter.after_step" not in info  # microseconds against 25 ms: under 1%
    assert "1 other hook stages took" in info and "under 1% each" in info


def test_the_full_timing_table_is_logged_at_debug_level(treadle_caplog):
    treadle_caplog.set_level(logging.DEBUG, logger="treadle")
    trainer = make_trainer([], [Counter(), Slow()])
    trainer.train(0, 5)
    debug = "\n".join(r.getMessage() for r in treadle_caplog.records if r.levelno == logging.DEBUG)
    assert "| Counter.after_step" in debug and "| Slow.after_step" in debug


def test_timings_give_the_step_the_loop_less_its_hooks(monkeypatch):
    """With a fake clock that the step advances by 10 and each hook stage by
    1, 2 or 5, every second lands where it was spent; after_backward hooks,
    which run inside the step, are not counted in the step."""
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])

    class Step(StepBase):
        def run_step(self):
            now[0] += 10
            self.trainer.after_backward()

    class Costly(HookBase):
        def before_step(self):
            now[0] += 1

        def after_backward(self):
            now[0] += 2

        def after_step(self):
            now[0] += 5

    trainer = TrainerBase(Step())
    trainer.register_hooks([Costly()])
    trainer.train(0, 3)
    assert trainer.timings() == {
        "step": 30.0,
        "Costly.before_step": 3.0,
        "Costly.after_backward": 6.0,
        "Costly.after_step": 15.0,
    }


def test_step_assignment_requires_a_step_object():
    with pytest.raises(TypeError, match="trainer.step must be a StepBase"):
        TrainerBase().step = object()
    with pytest.raises(RuntimeError, match="no step object"):
        TrainerBase().train(0, 1)


# ---------------------------------------------------------------------- epochs
class EpochRecorder(HookBase):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def after_step(self):
        self.log.append((self.name, "after_step", self.trainer.iter))

    def after_epoch(self):
        self.log.append((self.name, "after_epoch", self.trainer.epoch, self.trainer.iter))

    def after_train(self):
        self.log.append((self.name, "after_train", self.trainer.iter))


def epoch_events(log):
    return [e for e in log if e[1] != "after_step" and e[0] != "step"]


class EpochStartRecorder(HookBase):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def before_epoch(self):
        self.log.append((self.name, "before_epoch", self.trainer.epoch, self.trainer.iter))

    def before_step(self):
        self.log.append((self.name, "before_step", self.trainer.iter))


def test_before_epoch_runs_before_every_before_step_of_an_epochs_first_iteration():
    log = []
    trainer = make_trainer(log, [EpochStartRecorder("a", log), EpochStartRecorder("b", log)])
    trainer.epoch_length = 3
    trainer.train(0, 8)  # epochs 0-2, 3-5, and a last partial one, 6-7
    starts = [e for e in log if e[1] == "before_epoch"]
    assert starts == [("a", "before_epoch", 0, 0), ("b", "before_epoch", 0, 0), ("a", "before_epoch", 1, 3),
                      ("b", "before_epoch", 1, 3), ("a", "before_epoch", 2, 6), ("b", "before_epoch", 2, 6)]
    first_step = log.index(("a", "before_step", 3))
    assert log[first_step - 2:first_step] == [("a", "before_epoch", 1, 3), ("b", "before_epoch", 1, 3)]


@pytest.mark.parametrize("start, expected", [(4, [(2, 6)]), (3, [(1, 3), (2, 6)])])
def test_a_run_resumed_inside_an_epoch_begins_only_the_epochs_after_it(start, expected):
    log = []
    trainer = make_trainer(log, [EpochStartRecorder("a", log)])
    trainer.epoch_length = 3
    trainer.train(start, 8)
    assert [e[2:] for e in log if e[1] == "before_epoch"] == expected


def test_a_trainers_own_before_epoch_runs_without_hooks():
    class Counting(TrainerBase):
        def before_epoch(self):
            log.append(("trainer", self.epoch, self.iter))
            super().before_epoch()

    log = []
    trainer = make_trainer(log, [], cls=Counting)
    trainer.epoch_length = 2
    trainer.train(0, 5)
    assert [e for e in log if e[0] == "trainer"] == [("trainer", 0, 0), ("trainer", 1, 2), ("trainer", 2, 4)]


def test_after_epoch_runs_after_every_after_step_of_an_epochs_last_iteration():
    log = []
    trainer = make_trainer(log, [EpochRecorder("a", log), EpochRecorder("b", log)])
    trainer.epoch_length = 3
    trainer.train(0, 8)  # epochs 0-2, 3-5, and a last partial one, 6-7
    assert log[log.index(("b", "after_step", 2)) + 1] == ("a", "after_epoch", 0, 2)
    assert epoch_events(log) == [
        ("a", "after_epoch", 0, 2), ("b", "after_epoch", 0, 2),
        ("a", "after_epoch", 1, 5), ("b", "after_epoch", 1, 5),
        # The epoch that ends with training ends as the others do, at its last iteration.
        ("a", "after_epoch", 2, 7), ("b", "after_epoch", 2, 7), ("a", "after_train", 8), ("b", "after_train", 8),
    ]


class IterationEndRecorder(EpochRecorder):
    def after_iteration(self):
        self.log.append((self.name, "after_iteration", self.trainer.iter))


def test_the_last_epoch_ends_in_the_loop_once_before_its_iterations_end():
    # One mechanism for every epoch: the last one's after_epoch runs inside
    # its last iteration (so a checkpoint taken in after_iteration holds it),
    # with trainer.iter that iteration, and never again in after_train.
    log = []
    trainer = make_trainer(log, [IterationEndRecorder("a", log)])
    trainer.epoch_length = 2
    trainer.train(0, 4)
    assert [e for e in epoch_events(log) if e[1] != "after_iteration" or e[2] == 3] == [
        ("a", "after_epoch", 0, 1), ("a", "after_epoch", 1, 3), ("a", "after_iteration", 3), ("a", "after_train", 4),
    ]


def test_a_trainers_own_after_epoch_ends_the_last_epoch_as_the_others():
    log = []

    class OwnEpochEnd(TrainerBase):
        def after_epoch(self):
            super().after_epoch()
            log.append(("trainer", "after_epoch", self.epoch, self.iter))

    trainer = make_trainer(log, [EpochRecorder("a", log)], cls=OwnEpochEnd)
    trainer.epoch_length = 2
    trainer.train(0, 3)
    assert epoch_events(log) == [
        ("a", "after_epoch", 0, 1), ("trainer", "after_epoch", 0, 1),
        ("a", "after_epoch", 1, 2), ("trainer", "after_epoch", 1, 2), ("a", "after_train", 3),
    ]


@pytest.mark.parametrize("epoch_length,stop_at,ends", [
    (2, 3, [(0, 1), (1, 3)]),  # at an epoch's end: that epoch ends once
    (3, 4, [(0, 2), (1, 4)]),  # inside an epoch: the part of it that ran ends
])
def test_a_stop_request_ends_its_epoch(epoch_length, stop_at, ends):
    log = []
    stopper = CallbackHook(after_step=lambda t: t.request_stop("early") if t.iter == stop_at else None)
    trainer = make_trainer(log, [stopper, EpochRecorder("a", log)])
    trainer.epoch_length = epoch_length
    trainer.train(0, 10)
    assert epoch_events(log) == [("a", "after_epoch", *end) for end in ends] + [("a", "after_train", stop_at + 1)]


def test_no_after_epoch_for_a_failed_or_interrupted_epoch():
    log = []
    trainer = make_trainer(log, [EpochRecorder("a", log)], fail_at=3)
    trainer.epoch_length = 2
    with pytest.raises(ValueError):
        trainer.train(0, 10)
    assert epoch_events(log) == [("a", "after_epoch", 0, 1), ("a", "after_train", 3)]

    log.clear()
    stop = CallbackHook(after_step=lambda t: t.request_stop("preempted", interrupted=True) if t.iter == 2 else None)
    trainer = make_trainer(log, [stop, EpochRecorder("a", log)])
    trainer.epoch_length = 2
    trainer.train(0, 10)
    assert epoch_events(log) == [("a", "after_epoch", 0, 1), ("a", "after_train", 3)]


def test_a_resumed_run_counts_epochs_from_its_start():
    log = []
    trainer = make_trainer(log, [EpochRecorder("a", log)])
    trainer.epoch_length = 4
    trainer.train(6, 12)
    assert epoch_events(log) == [("a", "after_epoch", 1, 7), ("a", "after_epoch", 2, 11), ("a", "after_train", 12)]


class EpochSeen(HookBase):
    """Records ``trainer.epoch`` at every after_step and after_epoch."""

    def __init__(self, log):
        self.log = log

    def after_step(self):
        self.log.append(("after_step", self.trainer.iter, self.trainer.epoch))

    def after_epoch(self):
        self.log.append(("after_epoch", self.trainer.iter, self.trainer.epoch))


@pytest.mark.parametrize("stop_at", [2, 3])  # resumed at an epoch's first iteration; inside it
def test_a_run_resumed_inside_an_epoch_sees_the_epoch_an_uninterrupted_run_sees(stop_at):
    straight = []
    trainer = make_trainer([], [EpochSeen(straight)])
    trainer.epoch_length = 3
    trainer.train(0, 8)
    resumed = []
    stop = CallbackHook(after_step=lambda t: t.request_stop("preempted", interrupted=True) if t.iter == stop_at else None)
    first = make_trainer([], [stop, EpochSeen(resumed)])
    first.epoch_length = 3
    first.train(0, 8)
    second = make_trainer([], [EpochSeen(resumed)])
    second.epoch_length = 3
    second.train(stop_at + 1, 8)
    assert resumed == straight
    assert [epoch for stage, _, epoch in straight if stage == "after_step"] == [0, 0, 0, 1, 1, 1, 2, 2]


# ---------------------------------------------------------------------- periodic after_step
class Periodic(HookBase):
    def __init__(self, name, log, period):
        self.name, self.log, self.period = name, log, period

    def after_step_period(self):
        return self.period

    def after_step(self):
        self.log.append((self.name, self.trainer.iter))


def _after_steps(log, name):
    return [it for who, it in log if who == name]


def test_a_periodic_hook_registered_alone_is_called_at_its_periods_and_the_last_iteration_only():
    log = []
    trainer = make_trainer([], [Periodic("p5", log, 5)])
    trainer.train(0, 13)
    assert _after_steps(log, "p5") == [4, 9, 12]
    log.clear()
    trainer.train(7, 13)  # a resumed run counts periods from iteration 0
    assert _after_steps(log, "p5") == [9, 12]


def test_periodic_hooks_of_other_periods_are_each_called_at_their_own_iterations_in_list_order():
    log = []
    hooks = [Periodic("p3", log, 3), Periodic("every", log, None), Periodic("p4", log, 4), Periodic("last", log, 0)]
    trainer = make_trainer([], hooks)
    trainer.train(0, 9)
    assert _after_steps(log, "every") == list(range(9))
    assert _after_steps(log, "p3") == [2, 5, 8]
    assert _after_steps(log, "p4") == [3, 7, 8]
    assert _after_steps(log, "last") == [8]
    assert [who for who, it in log if it == 3] == ["every", "p4"]
    assert [who for who, it in log if it == 8] == ["p3", "every", "p4", "last"]


def test_a_hook_registered_in_training_runs_every_iteration_and_outside_training_every_hook_runs():
    log = []
    late = Periodic("late", log, 100)

    class Registrar(HookBase):
        def after_step(self):
            if self.trainer.iter == 1:
                self.trainer.register_hooks([late])

    trainer = make_trainer([], [Periodic("p5", log, 5), Registrar()])
    trainer.train(0, 6)
    assert _after_steps(log, "late") == [2, 3, 4, 5]
    assert _after_steps(log, "p5") == [4, 5]
    log.clear()
    trainer.after_step()  # outside the loop: every hook, as detectron2's
    assert log == [("p5", trainer.iter), ("late", trainer.iter)]


class _FaultCounter(HookBase):
    """Page faults per iteration over iterations ``first`` to ``last``."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last, self.at = first, last, {}

    def after_step(self) -> None:
        if self.trainer.iter in (self.first, self.last):
            self.at[self.trainer.iter] = minor_faults()

    def per_iteration(self) -> float:
        return (self.at[self.last] - self.at[self.first]) / (self.last - self.first)


@pytest.mark.skipif(sys.platform != "linux" or sys.implementation.name != "cpython" or sys.version_info < (3, 11),
                    reason="CPython's frame stack in chunks (3.11+); page faults counted by Linux")
def test_the_loop_maps_no_frame_stack_chunk_per_iteration_however_deep_its_step_calls():
    from treadle.engine import EagerStep

    torch.manual_seed(0)
    batches = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(80)]

    def hand_faults_per_iteration() -> float:
        model = DeepForward()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(batches):
            if i == 20:
                start = minor_faults()
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        return (minor_faults() - start) / (len(batches) - 20)

    if sys.version_info < (3, 13):
        # The hazard, in a hand-written loop: each forward maps a chunk of
        # the frame stack, faults its pages in and unmaps it on return.
        assert hand_faults_per_iteration() >= 1
    model = DeepForward()
    counter = _FaultCounter(20, 79)
    trainer = TrainerBase(EagerStep(model, batches, torch.optim.SGD(model.parameters(), lr=0.1),
                                    loss_fn=torch.nn.functional.cross_entropy))
    trainer.register_hooks([counter])
    trainer.train(0, 80)
    # treadle's loop runs in a chunk with room for the whole step.
    assert counter.per_iteration() < 0.25
