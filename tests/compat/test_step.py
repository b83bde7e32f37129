"""The plain Trainer's step for other trainers' update points
(treadle/compat/step.py): a Hezar ``training_step`` under accumulation,
whatever part of its loss it backpropagates itself, against Hezar's own
loop written by hand; pytorch-accelerated's step events around a Hezar
``training_step`` and a qurious ``train_step``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from treadle.trainer import Trainer
from treadle.hooks import HookBase

from tests.tiny_models import classification

CE = nn.functional.cross_entropy
PENALTY = 0.05


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def loader():
    return DataLoader(classification(64, 0), batch_size=16)


def penalty(model):
    """A term of the loss a training_step adds and backpropagates itself (an L1 penalty)."""
    return PENALTY * sum(p.abs().sum() for p in model.parameters())


class OwnBackward(Trainer):
    """Hezar's training_step, its backward its own (Hezar's self.accelerator.backward(loss))."""

    def training_step(self, input_batch):
        inputs, labels = input_batch
        loss = CE(self.model(inputs), labels)
        loss.backward()
        return loss.detach()


class ThroughSuper(Trainer):
    """Hezar's default training_step, through super()."""

    def training_step(self, input_batch):
        return super().training_step(input_batch)


class SuperPlusOwnTerm(Trainer):
    """super().training_step(batch) plus a term backpropagated by the override itself."""

    def training_step(self, input_batch):
        loss = super().training_step(input_batch)
        extra = penalty(self.model)
        extra.backward()  # Hezar's self.accelerator.backward(extra)
        return loss + extra.detach()


def hezars_loop(kind, updates, accumulate):
    """Hezar's loop written by hand: each micro-batch's backward goes through
    accelerator.backward, which divides the loss by gradient_accumulation_steps,
    then optimization_step (the optimizer step, the gradients zeroed)."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    batches = iter(loader())
    for _ in range(updates):
        for _ in range(accumulate):
            x, y = next(batches)
            (CE(model(x), y) / accumulate).backward()
            if kind is SuperPlusOwnTerm:
                (penalty(model) / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize("kind", [OwnBackward, ThroughSuper, SuperPlusOwnTerm])
@pytest.mark.parametrize("accumulate", [2, 3])
def test_a_hezar_training_step_under_accumulation_trains_as_hezars_loop_whatever_it_backpropagates_itself(
        kind, accumulate):
    updates = 4 // accumulate
    trainer = kind(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=updates, grad_accum_steps=accumulate,
                   progress_bar=False)
    trainer.train()
    by_hand = hezars_loop(kind, updates=updates, accumulate=accumulate)
    pairs = list(zip(trainer.model.parameters(), by_hand.parameters()))
    if accumulate == 2:
        # Bit-equal: each backward here is of the whole loss and the update's gradients are halved at its end,
        # where the hand loop halves each loss; a division by 2 is exact in floating point, so the sums agree.
        assert all(torch.equal(p, q) for p, q in pairs)
    else:
        # A division by 3 rounds: the mean of the sum and the sum of the thirds differ in the last bits
        # (3e-8 here), where a summed term would be off by its whole gradient (about 1e-2).
        assert all(torch.allclose(p, q, rtol=0, atol=1e-7) for p, q in pairs)


class StepEvents(HookBase):
    """pytorch-accelerated's callback of the step events, recording what each gets."""

    def __init__(self):
        self.seen = []

    def on_train_step_start(self, trainer, **kwargs):
        self.seen.append(("start", None))

    def on_train_step_end(self, trainer, batch, batch_output, **kwargs):
        self.seen.append(("end", batch_output))


@pytest.mark.parametrize("kind", [OwnBackward, ThroughSuper, SuperPlusOwnTerm])
def test_each_training_batch_of_a_hezar_training_step_calls_both_step_events(kind):
    events = StepEvents()
    trainer = kind(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=2, grad_accum_steps=2, hooks=[events],
                   progress_bar=False)
    trainer.train()
    assert [name for name, _ in events.seen] == ["start", "end"] * 4
    for _, output in events.seen[1::2]:
        assert set(output) == {"loss", "model_outputs", "batch_size"} and output["batch_size"] == 16
        assert isinstance(output["loss"], torch.Tensor) and output["loss"].dim() == 0
    # Where the override runs its own backward, the batch output is the loss it returned (no model outputs).
    if kind is OwnBackward:
        model = mlp()
        x, y = next(iter(loader()))
        assert events.seen[1][1]["model_outputs"] is None
        assert torch.equal(events.seen[1][1]["loss"], CE(model(x), y).detach())


class QuriousStep(Trainer):
    """qurious' train_step: the whole update, returning floats."""

    def train_step(self, batch):
        inputs, targets = self._prepare_batch(batch)
        self.optimizer.zero_grad()
        loss = self._compute_loss(self._forward_pass(inputs), targets)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}


def test_each_batch_of_a_qurious_train_step_calls_both_step_events():
    events = StepEvents()
    trainer = QuriousStep(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=3, hooks=[events],
                          progress_bar=False)
    history = trainer.train()
    assert [name for name, _ in events.seen] == ["start", "end"] * 3
    losses = [value for _, value in history.iterations["total_loss"]]
    ends = [output for name, output in events.seen if name == "end"]
    assert [output["loss"].item() for output in ends] == losses
    assert all(output["model_outputs"] is None and output["batch_size"] == 16 for output in ends)
