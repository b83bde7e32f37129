"""Update: one optimizer's update, written once, against hand-written PyTorch."""

import itertools
import logging

import pytest
import torch
from torch import nn

from treadle.data import DataStream
from treadle.engine import EagerStep, StepBase, TrainerBase, Update
from treadle.events import ScalarKind

from .test_steps import make_model, regression_data


def test_apply_is_zero_grad_backward_hooks_clip_step_as_written_by_hand():
    batches = regression_data(6)
    model, hand = make_model(), make_model()
    update = Update(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), clip_grad_norm=0.5)
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9)
    seen = []
    for x, y in batches:
        loss = nn.functional.mse_loss(model(x), y)
        norm = update.apply(loss, lambda: seen.append(next(model.parameters()).grad.clone()))
        hand_opt.zero_grad()
        nn.functional.mse_loss(hand(x), y).backward()
        seen_hand = next(hand.parameters()).grad.clone()
        hand_norm = torch.nn.utils.clip_grad_norm_(hand.parameters(), 0.5)
        hand_opt.step()
        assert torch.equal(norm, hand_norm) and torch.equal(seen[-1], seen_hand)  # after_backward: before clipping
    for a, b in zip(model.parameters(), hand.parameters()):
        assert torch.equal(a, b)


def test_backward_divides_by_the_accumulation_so_two_halves_are_one_batch():
    x, y = regression_data(1, batch=8)[0]
    model, hand = make_model(), make_model()
    update = Update(torch.optim.SGD(model.parameters(), lr=0.1), grad_accum_steps=2, clip_grad_value=0.05)
    update.zero_grad()
    for half in (slice(0, 4), slice(4, 8)):
        update.backward(nn.functional.mse_loss(model(x[half]), y[half]))
    assert update.step() is None
    hand_opt = torch.optim.SGD(hand.parameters(), lr=0.1)
    hand_opt.zero_grad()
    for half in (slice(0, 4), slice(4, 8)):
        (nn.functional.mse_loss(hand(x[half]), y[half]) / 2).backward()
    torch.nn.utils.clip_grad_value_(hand.parameters(), 0.05)
    hand_opt.step()
    for a, b in zip(model.parameters(), hand.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kwargs, message", [
    ({"grad_accum_steps": 0}, "grad_accum_steps must be an integer >= 1, got 0"),
    ({"clip_grad_norm": -1.0}, "clip_grad_norm must be positive or None, got -1.0"),
    ({"clip_grad_norm": 1.0, "clip_grad_value": 1.0}, "Give clip_grad_norm (1.0) or clip_grad_value (1.0), not both"),
    ({"precision": "fp8"}, "precision must be one of ('fp32', 'bf16', 'fp16'), got 'fp8'"),
    ({"precision": "fp16"}, "precision='fp16' needs CUDA (it trains with a GradScaler), but the model is on cpu. "
                            "Use precision='bf16' on CPU."),
])
def test_settings_that_cannot_train_are_refused_when_the_update_is_built(kwargs, message):
    with pytest.raises(ValueError) as error:
        Update(torch.optim.SGD(make_model().parameters(), lr=0.1), **kwargs)
    assert str(error.value) == message


def test_an_update_takes_an_optimizer():
    with pytest.raises(TypeError, match=r"^Update takes a torch.optim.Optimizer, got str$"):
        Update("sgd")


class TwoOptimizerStep(StepBase):
    """The weights with SGD, the biases with Adam, as docs/engine.md writes it."""

    def __init__(self, model, loader):
        self.model, self.data = model, DataStream(loader)
        weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
        biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
        self.update_w = Update(torch.optim.SGD(weights, lr=0.05, momentum=0.9))
        self.update_b = Update(torch.optim.Adam(biases, lr=1e-3))

    def run_step(self):
        x, y = next(self.data)
        loss = nn.functional.mse_loss(self.model(x), y)
        self.update_w.zero_grad()
        self.update_b.zero_grad()
        self.update_w.backward(loss)
        self.after_backward()
        self.update_w.step()
        self.update_b.step()
        self.storage.put_scalar("total_loss", loss.detach(), kind=ScalarKind.LOSS)


def shuffled(seed=0):
    data = torch.utils.data.TensorDataset(*map(torch.cat, zip(*regression_data(5))))
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed))


def test_a_research_step_with_two_updates_trains_as_a_hand_written_loop_and_resumes_exactly():
    model = make_model()
    TrainerBase(TwoOptimizerStep(model, shuffled())).train(0, 12)  # 5 batches a pass: two passes and two batches

    hand = make_model()
    weights = [p for name, p in hand.named_parameters() if name.endswith("weight")]
    biases = [p for name, p in hand.named_parameters() if name.endswith("bias")]
    opt_w, opt_b = torch.optim.SGD(weights, lr=0.05, momentum=0.9), torch.optim.Adam(biases, lr=1e-3)
    loader = shuffled()
    for x, y in [batch for _ in range(3) for batch in loader][:12]:
        loss = nn.functional.mse_loss(hand(x), y)
        opt_w.zero_grad()
        opt_b.zero_grad()
        loss.backward()
        opt_w.step()
        opt_b.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), hand.parameters()))

    first = make_model()
    step = TwoOptimizerStep(first, shuffled())
    trainer = TrainerBase(step)
    trainer.train(0, 7)
    saved = {"trainer": trainer.state_dict(), "model": first.state_dict(),
             "w": step.update_w.optimizer.state_dict(), "b": step.update_b.optimizer.state_dict()}
    assert set(saved["trainer"]["step"]) == {"data"} and saved["trainer"]["step"]["data"]["data_pass"]["epoch"] == 1
    torch.manual_seed(123)  # another process: nothing of the first one's random state is left
    resumed_model = make_model(seed=5)
    resumed_model.load_state_dict(saved["model"])
    resumed = TwoOptimizerStep(resumed_model, shuffled())
    resumed.update_w.optimizer.load_state_dict(saved["w"])
    resumed.update_b.optimizer.load_state_dict(saved["b"])
    trainer = TrainerBase(resumed)
    trainer.load_state_dict(saved["trainer"])
    trainer.train(7, 12)
    assert all(torch.equal(a, b) for a, b in zip(resumed_model.parameters(), hand.parameters()))


def test_a_step_reading_batches_no_checkpoint_keeps_says_so_once_at_the_first_checkpoint(caplog):
    class Cycling(StepBase):
        def __init__(self, model, loader):
            self.model, self.batches = model, itertools.cycle(loader)
            self.update = Update(torch.optim.SGD(model.parameters(), lr=0.1))

        def run_step(self):
            x, y = next(self.batches)
            self.update.apply(nn.functional.mse_loss(self.model(x), y))

    trainer = TrainerBase(Cycling(make_model(), shuffled()))
    trainer.train(0, 2)
    caplog.clear()  # the training's own lines, where an earlier test left the logger at INFO
    with caplog.at_level(logging.WARNING, logger="treadle.engine.train_loop"):
        trainer.state_dict()
        trainer.state_dict()
    assert [r.getMessage() for r in caplog.records] == [
        "Cycling reads its batches from a cycle, whose position no checkpoint keeps: a resumed run starts its "
        "data again at the first batch. Read them from a treadle.data.DataStream (self.data = DataStream(loader); "
        "next(self.data)) for an exact resume"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="treadle.engine.train_loop"):
        TrainerBase(TwoOptimizerStep(make_model(), shuffled())).state_dict()
        TrainerBase(Synthetic(make_model())).state_dict()  # no data to lose: the trainer's proxy is no iterator
        TrainerBase(EagerStep(make_model(), shuffled(), torch.optim.SGD(make_model().parameters(), lr=0.1),
                              loss_fn=nn.functional.mse_loss)).state_dict()
    assert caplog.records == []


class Synthetic(StepBase):
    """Data drawn inside the step (the checkpoint's random state puts it back)."""

    def __init__(self, model):
        self.model, self.update = model, Update(torch.optim.SGD(model.parameters(), lr=0.1))

    def run_step(self):
        x = torch.randn(8, 4)
        self.update.apply(self.model(x).pow(2).mean())


class TwoStreams(StepBase):
    """Two data streams held in a list: parts too, saved as ``streams.0`` and ``streams.1``."""

    def __init__(self, model, loaders):
        self.model, self.streams = model, [DataStream(loader) for loader in loaders]
        self.update = Update(torch.optim.SGD(model.parameters(), lr=0.05))

    def run_step(self):
        loss = sum(nn.functional.mse_loss(self.model(x), y) for x, y in (next(s) for s in self.streams))
        self.update.apply(loss)


def test_streams_held_in_a_list_are_saved_and_put_back():
    def run(iters, state=None, start=0):
        model = make_model()
        if state is not None:
            model.load_state_dict(state["model"])
        step = TwoStreams(model, [shuffled(0), shuffled(1)])
        trainer = TrainerBase(step)
        if state is not None:
            trainer.load_state_dict(state["trainer"])
        trainer.train(start, iters)
        return model, {"model": model.state_dict(), "trainer": trainer.state_dict()}

    full, _ = run(9)
    _, saved = run(4)
    assert set(saved["trainer"]["step"]) == {"streams.0", "streams.1"}
    torch.manual_seed(7)
    resumed, _ = run(9, saved, start=4)
    assert all(torch.equal(a, b) for a, b in zip(full.parameters(), resumed.parameters()))


def test_an_update_of_a_model_that_is_no_module_is_refused():
    optimizer = torch.optim.SGD(make_model().parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"^Update's model is the module whose gradients it syncs \(an nn.Module\), "
                                        r"got SGD$"):
        Update(optimizer, model=optimizer)


def test_a_step_refuses_state_it_has_no_part_for():
    step = TwoOptimizerStep(make_model(), shuffled())
    with pytest.raises(KeyError, match=r"TwoOptimizerStep keeps no state under \['queue'\] \(its parts: "
                                       r"\['data', 'update_b', 'update_w'\]\)"):
        step.load_state_dict({"queue": [1]})


def test_every_step_of_treadle_updates_through_its_update(monkeypatch):
    """EagerStep and the plain Trainer's step for other trainers' override points
    share one update: the Update's, no copy of it (each call goes through it)."""
    from treadle.trainer import Trainer

    calls = []
    step_of_update = Update.step
    monkeypatch.setattr(Update, "step", lambda self, *a, **k: calls.append(self) or step_of_update(self, *a, **k))

    class Hezar(Trainer):
        def optimization_step(self):  # Hezar's override point: the update goes through TrainerStep
            super().optimization_step()

    for cls in (Trainer, Hezar):
        model = make_model()
        trainer = cls(model, torch.optim.SGD(model.parameters(), lr=0.1),
                      torch.utils.data.DataLoader(regression_data(4), batch_size=None),
                      loss_fn=nn.functional.mse_loss, max_iter=3)
        trainer.train()
        assert type(trainer.step).__name__ == ("EagerStep" if cls is Trainer else "TrainerStep")
        assert calls == [trainer.step.update] * 3
        calls.clear()

