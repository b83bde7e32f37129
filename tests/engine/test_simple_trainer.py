"""detectron2's SimpleTrainer and AMPTrainer under treadle: the step object
they build, their options, a research run_step, and exact resume."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from torch import nn

from treadle.checkpoint import DetectionCheckpointer
from treadle.engine import AMPTrainer, EagerStep, SimpleTrainer, hooks


class LossDictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, batch: torch.Tensor) -> dict:
        out = self.linear(batch)
        return {"loss_reg": out.pow(2).mean(), "loss_l1": out.abs().mean()}


def endless(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield torch.randn(4, 3, generator=generator)


def by_hand(steps: int, lr: float = 0.1) -> nn.Module:
    torch.manual_seed(0)
    model = LossDictModel()
    opt = torch.optim.SGD(model.parameters(), lr)
    batches = endless()
    for _ in range(steps):
        losses = model(next(batches))
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
    return model


def test_simple_trainer_is_a_trainer_base_with_an_eager_step_and_trains_as_by_hand():
    torch.manual_seed(0)
    model = LossDictModel()
    trainer = SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), 0.1))
    assert isinstance(trainer.step, EagerStep)
    assert trainer.model is model and trainer.optimizer is trainer.step.optimizer
    trainer.train(0, 7)
    expected = by_hand(7)
    for a, b in zip(model.parameters(), expected.parameters()):
        assert torch.equal(a, b)
    # Each loss term is published, and their sum as total_loss.
    latest = trainer.storage.latest()
    assert {"total_loss", "loss_reg", "loss_l1"} <= set(latest)


def test_run_step_overridden_with_detectron2s_data_loader_iter():
    class ResearchTrainer(SimpleTrainer):
        def run_step(self):
            batch = next(self._data_loader_iter)
            losses = self.model(batch)
            total = sum(losses.values())
            self.optimizer.zero_grad()
            total.backward()
            self.optimizer.step()
            self.storage.put_scalar("research_loss", total.detach())

    torch.manual_seed(0)
    model = LossDictModel()
    trainer = ResearchTrainer(model, endless(), torch.optim.SGD(model.parameters(), 0.1))
    trainer.train(0, 5)
    for a, b in zip(model.parameters(), by_hand(5).parameters()):
        assert torch.equal(a, b)
    assert [i for _, i in trainer.storage.history("research_loss").values()] == list(range(5))


@pytest.mark.parametrize("value", [0, -1, 2.5, "5"])
def test_gather_metric_period_must_be_a_positive_int(value):
    model = LossDictModel()
    with pytest.raises(ValueError, match="gather_metric_period must be an integer >= 1"):
        SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), 0.1), gather_metric_period=value)


def test_amp_trainer_bf16_on_cpu_trains_in_mixed_precision():
    torch.manual_seed(0)
    model = LossDictModel()
    trainer = AMPTrainer(model, endless(), torch.optim.SGD(model.parameters(), 0.1), precision=torch.bfloat16)
    assert trainer.step.precision == "bf16" and trainer.grad_scaler is None
    before = model.linear.weight.detach().clone()
    trainer.train(0, 3)
    assert model.linear.weight.dtype == torch.float32  # the weights stay fp32; autocast runs the forward
    assert not torch.equal(before, model.linear.weight)


def test_amp_trainer_fp16_on_cpu_and_other_precisions_are_refused():
    model = LossDictModel()
    opt = torch.optim.SGD(model.parameters(), 0.1)
    with pytest.raises(ValueError, match="torch.float16 or torch.bfloat16"):
        AMPTrainer(model, endless(), opt, precision=torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16'? needs CUDA"):
            AMPTrainer(model, endless(), opt)


def test_simple_trainer_checkpointed_through_trainer_alone_resumes_the_optimizer_exactly(tmp_path):
    def build():
        torch.manual_seed(0)
        model = LossDictModel()
        opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)
        trainer = SimpleTrainer(model, endless(), opt)
        # detectron2's DefaultTrainer registers only the trainer: the optimizer travels in its state.
        checkpointer = DetectionCheckpointer(model, str(tmp_path), trainer=trainer)
        trainer.register_hooks([hooks.PeriodicCheckpointer(checkpointer, 5)])
        return trainer, checkpointer

    full, _ = build()
    full.train(0, 10)
    expected = [p.detach().clone() for p in full.model.parameters()]

    for path in tmp_path.iterdir():
        if path.name != "model_0000004.pth":
            path.unlink()
    (tmp_path / "last_checkpoint").write_text("model_0000004.pth")

    resumed, checkpointer = build()
    checkpointer.resume_or_load("", resume=True)
    assert resumed.iter == 4  # the last finished iteration
    assert resumed.optimizer.state_dict()["state"], "momentum buffers come back"
    # A plain generator has no state to save: continue the stream past the 5 batches used.
    resumed.reset_data_loader(lambda: itertools.islice(endless(), 5, None))
    resumed.train(resumed.iter + 1, 10)
    for a, b in zip(resumed.model.parameters(), expected):
        assert torch.equal(a, b)


def test_libai_style_step_subclass_takes_batches_with_next_batch():
    from treadle.engine import TrainerBase

    class MyEagerStep(EagerStep):
        """LiBai's documented MyEagerTrainer: keeps the model's last output."""

        def __init__(self, model, data_loader, optimizer):
            super().__init__(model, data_loader, optimizer)
            self.previous_output = None

        def run_step(self):
            data = self.next_batch()
            loss_dict = self.model(data)
            self.previous_output = loss_dict
            total = sum(loss_dict.values())
            self.optimizer.zero_grad()
            total.backward()
            self.optimizer.step()
            self.storage.put_scalar("total_loss", total.detach())

    torch.manual_seed(0)
    model = LossDictModel()
    step = MyEagerStep(model, list(itertools.islice(endless(), 3)), torch.optim.SGD(model.parameters(), 0.1))
    TrainerBase(step).train(0, 7)  # 7 iterations over 3 batches: passes restart
    assert set(step.previous_output) == {"loss_reg", "loss_l1"}
    torch.manual_seed(0)
    expected = LossDictModel()
    opt = torch.optim.SGD(expected.parameters(), 0.1)
    batches = list(itertools.islice(endless(), 3))
    for i in range(7):
        opt.zero_grad()
        sum(expected(batches[i % 3]).values()).backward()
        opt.step()
    for a, b in zip(model.parameters(), expected.parameters()):
        assert torch.equal(a, b)


def test_a_model_replaced_on_the_trainer_is_the_one_whose_gradients_accumulation_syncs():
    """detectron2 sets ``trainer.model`` to the DDP-wrapped model: its no_sync() must be the one used."""
    synced = []

    class Wrapped(LossDictModel):
        def no_sync(self):
            synced.append(True)
            return contextlib.nullcontext()

    torch.manual_seed(0)
    model = LossDictModel()
    trainer = SimpleTrainer(model, endless(), torch.optim.SGD(model.parameters(), 0.1))
    trainer.step.update.grad_accum_steps = 2
    wrapped = Wrapped()
    wrapped.load_state_dict(model.state_dict())
    trainer.model = wrapped
    trainer.train(0, 1)
    assert synced == [True]  # the first of two micro-batches, without its all-reduce
