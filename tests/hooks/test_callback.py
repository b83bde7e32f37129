"""CallbackHook: plain functions called at the stages they are given for."""

import pytest

from tests.engine.test_train_loop import make_trainer
from treadle.hooks import CallbackHook


def test_callback_hook_is_reusable_across_train_calls():
    calls = []
    hook = CallbackHook(before_train=lambda t: calls.append("bt"), after_step=lambda t: calls.append(t.iter))
    trainer = make_trainer([], [hook])
    trainer.train(0, 2)
    trainer.train(2, 3)
    assert calls == ["bt", 0, 1, "bt", 2]
    with pytest.raises(TypeError, match="after_step must be callable"):
        CallbackHook(after_step=3)
