
import pytest
import torch
from torch import nn

from tests.hooks.helpers import make_trainer
from treadle.hooks import (
    EMA,
    CallbackHook,
    EvalHook,
)


def test_ema_matches_a_hand_computation_and_swaps_weights_for_evaluation():
    model = nn.Linear(3, 1)
    trainer, _ = make_trainer(model)
    history = []
    ema = EMA(0.5)
    seen_in_eval = []
    trainer.register_hooks(
        [
            CallbackHook(after_step=lambda t: history.append({k: v.clone() for k, v in model.state_dict().items()})),
            ema,
            EvalHook(0, lambda: seen_in_eval.append(model.weight.detach().clone()) or {"x": 0.0}),
        ]
    )
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train(0, 4)
    expected = initial["weight"]
    for state in history:
        expected = 0.5 * expected + 0.5 * state["weight"]
    torch.testing.assert_close(ema.averaged_state_dict()["weight"], expected)
    torch.testing.assert_close(seen_in_eval[0], expected)  # evaluation saw the average
    assert torch.equal(model.weight, history[-1]["weight"])  # and the trained weights came back
    assert ema.num_updates == 4


def test_ema_state_round_trip_and_warmup():
    model = nn.Linear(2, 1)
    ema = EMA(0.99, model=model, warmup=True)
    assert ema._current_decay() == pytest.approx(0.1)
    ema.update()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update()
    state = ema.state_dict()
    other = EMA(0.99, model=model, warmup=True)
    other.load_state_dict(state)
    assert other.num_updates == 2
    torch.testing.assert_close(other.averaged_state_dict()["weight"], ema.averaged_state_dict()["weight"])
    with pytest.raises(ValueError, match="decay must be in"):
        EMA(1.0)


def test_averaged_weights_restores_trained_weights_after_an_exception():
    model = nn.Linear(2, 1)
    ema = EMA(0.5, model=model)
    ema.update()
    with torch.no_grad():
        model.weight.fill_(3.0)
    with pytest.raises(ValueError):
        with ema.averaged_weights():
            assert not torch.all(model.weight == 3.0)
            raise ValueError
    assert torch.all(model.weight == 3.0)


def test_ema_declares_its_period_and_the_trainer_calls_it_only_there():
    # update_every is the hook's declared period (the hook rule): the trainer
    # calls after_step after iterations 2, 5 and 8 of 10, not at every
    # iteration, and not at the last one (the updates keep their spacing).
    calls = []

    class CountingEMA(EMA):
        def after_step(self):
            calls.append(self.trainer.iter)
            super().after_step()

    model = nn.Linear(3, 1)
    trainer, _ = make_trainer(model)
    ema = CountingEMA(0.5, update_every=3)
    trainer.register_hooks([ema])
    trainer.train(0, 10)
    assert ema.after_step_period() == 3
    assert calls == [2, 5, 8]
    assert ema.num_updates == 3
