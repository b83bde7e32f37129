"""HookBase: what a hook declares (its saved state, the hooks it works with, its period) and what that does."""

import pytest

from tests.engine.test_train_loop import Consumer, Counter, Periodic, Producer, _after_steps, make_trainer
from treadle.hooks import HookBase


def test_default_hook_state_rejects_unknown_keys():
    with pytest.raises(KeyError, match="Counter got unknown state keys"):
        Counter().load_state_dict({"count": 1, "other": 2})


class User(HookBase):
    uses = (Producer,)


def test_a_hook_finds_the_hooks_it_declares_resolved_at_registration():
    trainer = make_trainer([])
    first, consumer, user = Producer(), Consumer(), User()
    assert consumer.hooks_of(Producer) == []  # not registered yet
    trainer.register_hooks([first, consumer, user])
    assert consumer.hooks_of(Producer) == [first] and user.hooks_of(Producer) == [first]
    later_trainer, user, early, late = make_trainer([]), User(), Producer(), Producer()
    later_trainer.register_hooks([early, user])
    later_trainer.register_hooks([late])  # `uses` sets no order; a later registration is resolved too
    assert user.hooks_of(Producer) == [early, late]
    with pytest.raises(TypeError, match=r"Consumer.hooks_of\(User\): declare User in Consumer.runs_after or .uses"):
        consumer.hooks_of(User)


class OwnAfterStepSubclass(Periodic):
    def after_step(self):  # its own after_step: called at the period it inherits
        self.log.append((self.name, self.trainer.iter))


class EveryIterationSubclass(Periodic):
    def after_step_period(self):  # declares that its after_step has work every iteration
        return None


def test_a_subclass_keeps_its_parents_period_unless_it_declares_its_own():
    log = []
    trainer = make_trainer([], [OwnAfterStepSubclass("own", log, 5), EveryIterationSubclass("every", log, 5)])
    trainer.train(0, 12)
    assert _after_steps(log, "own") == [4, 9, 11]
    assert _after_steps(log, "every") == list(range(12))
