"""The hook rule without exceptions: a periodic hook is called exactly at its
iterations, and at the run's last one only where it declares so; work at
an iteration's end is a declared stage; a trainer's own stages run whatever
hooks are registered."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from treadle.checkpoint import Checkpointer
from treadle.engine import HookBase, StepBase, TrainerBase
from treadle.engine.hook_methods import stray_method
from treadle.events import ScalarKind
from treadle.hooks import EvalHook, PeriodicCheckpointer, PreciseBN, PreemptionHandler
from treadle.hooks.callback import CallbackHook

MAX_ITER = 10


class Step(StepBase):
    def run_step(self):
        self.storage.put_scalar("total_loss", torch.tensor(1.0), kind=ScalarKind.LOSS)


class Periodic(HookBase):
    """Declares a period for both periodic stages and records where it is called."""

    def __init__(self, period, at_last):
        self.period, self.runs_at_last_iteration = period, at_last
        self.steps, self.iterations = [], []

    def after_step_period(self):
        return self.period

    def after_iteration_period(self):
        return self.period

    def after_step(self):
        self.steps.append(self.trainer.iter)

    def after_iteration(self):
        self.iterations.append(self.trainer.iter)


def train(*hooks, max_iter=MAX_ITER, epoch_length=None, trainer_class=TrainerBase):
    trainer = trainer_class(Step())
    trainer.epoch_length = epoch_length
    trainer.register_hooks(list(hooks))
    trainer.train(0, max_iter)
    return trainer


@pytest.mark.parametrize("period, at_last, expected", [
    (3, True, [2, 5, 8, 9]),
    (3, False, [2, 5, 8]),
    (5, True, [4, 9]),
    (0, True, [9]),
    (0, False, []),
    (None, False, list(range(MAX_ITER))),  # no period: every iteration, whatever the flag says
])
def test_a_periodic_stage_runs_at_its_iterations_and_at_the_last_only_where_declared(period, at_last, expected):
    hook = Periodic(period, at_last)
    train(hook)
    assert hook.steps == expected
    assert hook.iterations == expected


def test_after_iteration_runs_after_every_hooks_after_step_and_after_epoch_of_the_iteration():
    order = []

    class Late(HookBase):
        def after_iteration(self):
            order.append(("iteration", self.trainer.iter))

    class Early(HookBase):
        def after_step(self):
            order.append(("step", self.trainer.iter))

        def after_epoch(self):
            order.append(("epoch", self.trainer.iter))

    trainer = train(Late(), Early(), max_iter=4, epoch_length=2)
    assert order[:6] == [("step", 0), ("iteration", 0), ("step", 1), ("epoch", 1), ("iteration", 1), ("step", 2)]
    assert "Late.after_iteration" in trainer.timings()


def test_eval_hook_evaluates_at_its_period_and_once_at_the_last_iteration():
    hook_iters = []
    hook = EvalHook(3, lambda: hook_iters.append(hook.trainer.iter) or {"a": 1.0})
    train(hook)
    # After iterations 2, 5, 8 (period 3) and 9 (the last: the final evaluation), not again after training.
    assert hook_iters == [2, 5, 8, 9]
    hook_iters.clear()
    hook = EvalHook(3, lambda: hook_iters.append(hook.trainer.iter) or {"a": 1.0}, eval_after_train=False)
    train(hook)
    assert hook_iters == [2, 5, 8]


def test_periodic_checkpointer_saves_at_its_period_and_model_final_at_the_end(tmp_path):
    model = nn.Linear(2, 2)
    trainer = TrainerBase(Step())
    trainer.register_hooks([PeriodicCheckpointer(Checkpointer(model, str(tmp_path), trainer=trainer), 4)])
    trainer.train(0, MAX_ITER)
    assert sorted(p.name for p in tmp_path.glob("model_*.pth")) == ["model_0000003.pth", "model_0000007.pth",
                                                                    "model_final.pth"]


def test_precise_bn_recomputes_at_its_period_and_at_the_last_iteration(monkeypatch):
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    hook = PreciseBN(4, model, [torch.randn(8, 2) for _ in range(2)], num_iter=2)
    calls = []
    monkeypatch.setattr(PreciseBN, "update_stats", lambda self: calls.append(self.trainer.iter))
    train(hook)
    assert calls == [3, 7, 9]  # 9: the final weights, for the final evaluation, once


def test_preemption_handler_on_one_process_is_due_only_once_its_signal_came(tmp_path):
    import os
    import signal

    model = nn.Linear(2, 2)
    trainer = TrainerBase(Step())
    handler = PreemptionHandler(Checkpointer(model, str(tmp_path), trainer=trainer), exit_code=None)
    called = []
    original = handler.after_iteration

    def counted():
        called.append(trainer.iter)
        original()

    handler.after_iteration = counted
    kill = CallbackHook(after_step=lambda t: os.kill(os.getpid(), signal.SIGUSR1) if t.iter == 4 else None)
    trainer.register_hooks([handler, kill])
    trainer.train(0, MAX_ITER)
    # Not called before the signal (nothing is read per iteration); the signal
    # arrived in iteration 4's after_step, and the loop, planned again, called
    # the handler at 4's end: saved there.
    assert called == [4]
    assert trainer.last_run_iter == 4 and (tmp_path / "model_0000004.pth").is_file()


def test_a_trainers_own_after_epoch_runs_at_every_epoch_end_with_no_hook_registered():
    ends = []

    class EpochTrainer(TrainerBase):
        def after_epoch(self):
            super().after_epoch()
            ends.append((self.epoch, self.iter))

    trainer = train(max_iter=9, epoch_length=3, trainer_class=EpochTrainer)
    # Every epoch ends in the loop, at its last iteration: the run's last one too.
    assert ends == [(0, 2), (1, 5), (2, 8)]
    assert trainer.hooks == []


class Publishes(HookBase):
    """Declares the scalars it puts, as their one producer."""

    def __init__(self, *names):
        self.names = names

    def scalar_names(self):
        return self.names

    def after_step(self):
        for name in self.names:
            self.trainer.storage.put_scalar(name, 1.0)


def test_two_hooks_declaring_one_scalar_name_are_refused_at_registration():
    trainer = TrainerBase(Step())
    trainer.register_hooks([Publishes("a", "a", "b"), Periodic(2, True)])  # one hook may put a name twice
    with pytest.raises(ValueError) as refused:
        trainer.register_hooks([Publishes("c"), Publishes("b")])
    assert str(refused.value) == (
        "Publishes and Publishes#3 both publish the scalar 'b': writers keep one value per name and iteration, "
        "so one of the two would be lost; give each its own name, or register one of them"
    )
    assert [type(h) for h in trainer.hooks] == [Publishes, Periodic]



# ---------------------------------------------------------------------- methods named like stages
class MMEngineStyle(HookBase):
    """A hook written for MMEngine: its stages are not treadle's, and would never be called."""

    def __init__(self):
        self.calls = []

    def before_train_epoch(self, runner):
        self.calls.append("before_train_epoch")

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.calls.append("before_train_iter")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.calls.append("after_train_iter")

    def after_train_epoch(self, runner):
        self.calls.append("after_train_epoch")

    def after_val_epoch(self, runner, metrics=None):
        self.calls.append("after_val_epoch")


_STAGES = ("before_train, before_epoch, before_step, after_backward, after_step, after_epoch, after_iteration, "
           "after_train")


@pytest.mark.parametrize("name, stage", [
    ("before_train_iter", "before_step"),
    ("after_train_iter", "after_step"),
    ("before_train_epoch", "before_epoch"),
    ("after_train_epoch", "after_epoch"),
    ("after_val_epoch", "after_epoch"),
    ("on_train_batch_end", "after_step"),
    ("on_fit_start", "before_train"),
])
def test_a_method_named_like_a_stage_that_is_none_is_refused_at_registration_naming_the_stage_to_use(name, stage):
    hook = type("Foreign", (HookBase,), {name: lambda self, *args: None})()
    trainer = TrainerBase(Step())
    with pytest.raises(TypeError) as refused:
        trainer.register_hooks([Periodic(2, True), hook])
    assert str(refused.value) == (
        f"Foreign.{name} is not a hook stage, so the trainer would never call it: override {stage} "
        f"(the stages: {_STAGES}), or name a helper of your own without {name.split('_')[0]}_ (_{name})"
    )
    assert trainer.hooks == []  # nothing of the list is registered


def test_an_mmengine_hook_is_refused_before_training_and_one_with_treadles_stages_trains():
    trainer = TrainerBase(Step())
    hook = MMEngineStyle()
    with pytest.raises(TypeError, match=r"^MMEngineStyle\.after_train_epoch is not a hook stage, .*override "
                                        r"after_epoch \("):
        trainer.register_hooks([hook])

    class Ported(HookBase):
        def __init__(self):
            self.steps = []

        def before_step(self):
            self.steps.append(self.trainer.iter)

        def _after_step_helper(self):  # private: a helper of the hook's own
            pass

    ported = train(Ported(), max_iter=3)
    assert ported.hooks[0].steps == [0, 1, 2]
    assert hook.calls == []


def test_a_stage_with_another_frameworks_arguments_is_refused_at_registration():
    class RunnerHook(HookBase):
        def before_train(self, runner):
            pass

    trainer = TrainerBase(Step())
    with pytest.raises(TypeError) as refused:
        trainer.register_hooks([RunnerHook()])
    assert str(refused.value) == (
        "RunnerHook.before_train(runner) takes arguments, and the trainer calls before_train() with none: read the "
        "trainer as self.trainer, the rest from it (docs/engine.md)"
    )
    assert trainer.hooks == []

    class WithDefaults(HookBase):  # callable with no argument: registered
        def after_step(self, *args, scale=1.0):
            pass

    trainer.register_hooks([WithDefaults()])
    assert [type(h) for h in trainer.hooks] == [WithDefaults]


def test_a_trainer_names_the_methods_it_calls_besides_the_stages():
    class Events(HookBase):
        def on_event(self):
            pass

    class EventTrainer(TrainerBase):
        def hook_methods_called(self, hook):
            return ("on_event",)

    with pytest.raises(TypeError, match=r"^Events\.on_event is not a hook stage"):
        TrainerBase(Step()).register_hooks([Events()])
    trainer = EventTrainer(Step())
    trainer.register_hooks([Events()])
    assert [type(h) for h in trainer.hooks] == [Events]


def test_no_hook_treadle_ships_has_a_method_named_like_a_stage_that_is_none():
    import importlib
    import pkgutil

    import treadle

    for module in pkgutil.walk_packages(treadle.__path__, "treadle."):
        importlib.import_module(module.name)
    classes, todo = [], [HookBase]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    shipped = {c for c in classes if c.__module__.startswith("treadle.")}
    assert len(shipped) >= 20  # the walk found them (21 when written)
    assert {c.__qualname__: stray_method(c) for c in shipped if stray_method(c)} == {}


def test_a_callable_is_named_as_its_user_wrote_it():
    import functools

    from treadle.engine.hook_table import callable_name

    def log_metrics(trainer, epoch, metrics):
        pass

    class Scorer:
        def __call__(self, trainer, epoch, metrics):
            pass

        def on_train_epoch_end(self, trainer):
            pass

    assert callable_name(log_metrics) == "log_metrics"
    assert callable_name(functools.partial(log_metrics, None)) == "log_metrics"
    assert callable_name(Scorer()) == "Scorer"
    assert callable_name(Scorer().on_train_epoch_end) == "Scorer.on_train_epoch_end"
