"""The seeds' override points (treadle/compat/names.py's table): each
name a seed documents is called at the seed's moment or refused when built,
and the seeds' own examples run as their users write them."""

from __future__ import annotations

import collections
import copy
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from treadle.config import LazyConfig
from treadle.engine import EagerStep
from treadle.trainer import Trainer
from treadle.engine.defaults import DefaultTrainer
from treadle.compat.names import CALLBACK_EVENTS, OVERRIDE_POINTS, SEED_METHODS
from treadle.compat.overrides import SeedOverrides
from tests.compat.pages import seed_pages
from treadle.hooks import HookBase

from tests.seeds.qurious_l1_job import L1Trainer  # qurious' train_step with an L1 penalty, as its user writes it
from tests.tiny_models import classification

render_markdown = seed_pages.render_markdown
ROOT = Path(__file__).resolve().parents[2]
CE = nn.functional.cross_entropy


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def loader(n=64, seed=0, batch_size=16):
    return DataLoader(classification(n, seed), batch_size=batch_size)


def counting_subclass(name: str, counts: collections.Counter, base: type = Trainer) -> type:
    """A subclass whose ``name`` counts its calls and does what the base does."""

    def method(self, *args, **kwargs):
        counts[name] += 1
        return getattr(super(cls, self), name)(*args, **kwargs)

    cls = type(f"With_{name}", (base,), {name: method})
    return cls


# ---------------------------------------------------------------------- the table, walked
TRAINER_POINTS = [p for p in OVERRIDE_POINTS if p.on == "Trainer"]


@pytest.mark.parametrize("point", TRAINER_POINTS, ids=[p.name for p in TRAINER_POINTS])
def test_every_seed_method_on_a_trainer_subclass_is_called_or_refused_when_built(point, tmp_path):
    counts: collections.Counter = collections.Counter()
    cls = counting_subclass(point.name, counts)
    # create_scheduler builds the schedule: scheduler= is refused beside it.
    schedule = {} if point.name == "create_scheduler" else {"scheduler": "cosine"}

    def build():
        return cls(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=loader(32, seed=1), max_epochs=2,
                   progress_bar=False, **schedule)

    if not point.called:
        with pytest.raises(TypeError, match=rf"^{cls.__name__}\.{point.name} \(.*\) is never called by treadle: "):
            build()
        return
    trainer = build()
    trainer.train()
    trainer.evaluate()
    assert counts[point.name] > 0, f"{point.name} was never called"


def test_a_refused_method_says_what_to_write_instead_in_one_line():
    class AcceleratedTrainer(Trainer):
        def create_train_dataloader(self, batch_size, train_dl_kwargs=None):
            return DataLoader(classification(), batch_size=batch_size)

    with pytest.raises(TypeError) as error:
        AcceleratedTrainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2)
    assert str(error.value) == (
        "AcceleratedTrainer.create_train_dataloader (pytorch-accelerated and Hezar's) is never called by treadle: "
        "give the Trainer a DataLoader (train_loader=, eval_loader=), which it iterates as given (docs/migrating.md)"
    )
    assert SEED_METHODS["create_train_dataloader"].startswith("pytorch-accelerated and Hezar's; give the Trainer")


def test_lightnings_training_step_is_refused_and_hezars_is_called():
    class LightningStyle(Trainer):
        def training_step(self, batch, batch_idx):
            return CE(self.model(batch[0]), batch[1])

    with pytest.raises(TypeError, match=r"^LightningStyle\.training_step takes \(batch, batch_idx\), Lightning's "
                                        r"signature, which treadle never calls: override compute_loss"):
        LightningStyle(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2)


LIBAI_POINTS = [p for p in OVERRIDE_POINTS if p.on == "DefaultTrainer"]


def digits_cfg(tmp_path):
    cfg = LazyConfig.load(str(ROOT / "configs" / "digits_mlp.py"))
    return LazyConfig.apply_overrides(cfg, [f"train.output_dir={tmp_path}", "train.max_iter=4",
                                            "train.eval_period=2", "lr_multiplier.warmup_iters=1"])


def test_libais_default_trainer_methods_are_called(tmp_path):
    counts: collections.Counter = collections.Counter()
    members = {}
    for point in LIBAI_POINTS:
        if isinstance(inspect.getattr_static(DefaultTrainer, point.name), classmethod):
            def method(cls, *args, _name=point.name, **kwargs):
                counts[_name] += 1
                return getattr(super(Subclass, cls), _name)(*args, **kwargs)
            members[point.name] = classmethod(method)
        else:
            def method(self, *args, _name=point.name, **kwargs):
                counts[_name] += 1
                return getattr(super(Subclass, self), _name)(*args, **kwargs)
            members[point.name] = method
    Subclass = type("LiBaiTrainer", (DefaultTrainer,), members)
    Subclass(digits_cfg(tmp_path)).train()
    assert {p.name for p in LIBAI_POINTS} == {name for name, n in counts.items() if n > 0}


def test_libais_run_step_with_get_batch_on_a_step_is_refused_when_assigned():
    class MyEagerTrainer(EagerStep):
        def run_step(self, get_batch):
            loss_dict = self.model(**get_batch())
            self.previous_output = loss_dict

    model = mlp()
    step = MyEagerTrainer(model, loader(), torch.optim.SGD(model.parameters(), lr=0.1), loss_fn=CE)
    with pytest.raises(TypeError, match=r"^MyEagerTrainer\.run_step takes arguments, and the trainer calls "
                                        r"step\.run_step\(\) with none: a step's run_step\(\) takes no argument in "
                                        r"treadle \(LiBai's run_step\(get_batch\)\): get each batch with "
                                        r"self\.next_batch\(\)"):
        Trainer(model, step.optimizer, loader(), loss_fn=CE, max_iter=2).step = step


# ---------------------------------------------------------------------- pytorch-accelerated's callbacks
class EveryEvent(HookBase):
    """A hook with every pytorch-accelerated event, recording the order."""

    def __init__(self):
        self.seen = []


for _event in CALLBACK_EVENTS:
    setattr(EveryEvent, _event, lambda self, trainer, _e=_event, **kwargs: self.seen.append((_e, set(kwargs))))


class PlainCallback:
    """pytorch-accelerated's TrainerCallback: an object with on_* methods, not a hook."""

    def __init__(self):
        self.epochs = []

    def on_train_epoch_end(self, trainer, **kwargs):
        self.epochs.append(trainer.iter)

    def on_training_run_end(self, trainer, **kwargs):
        self.epochs.append("end")


def test_every_callback_event_is_called_in_pytorch_accelerateds_order():
    hook, plain = EveryEvent(), PlainCallback()
    trainer = Trainer(mlp(), "sgd", loader(64, batch_size=32), lr=0.1, loss_fn=CE,
                      eval_loader=loader(32, seed=1, batch_size=32),
                      max_epochs=2, hooks=[hook], callbacks=[plain], progress_bar=False)
    trainer.train()
    trainer.evaluate()
    events = [e for e, _ in hook.seen]
    assert set(events) == set(CALLBACK_EVENTS)
    assert events == [
        "on_init_end", "on_training_run_start",
        *["on_train_epoch_start",
          "on_train_step_start", "on_train_step_end", "on_train_step_start", "on_train_step_end",
          "on_train_epoch_end", "on_eval_epoch_start", "on_eval_step_start", "on_eval_step_end",
          "on_eval_epoch_end", "on_training_run_epoch_end"] * 2,
        "on_training_run_end",
        "on_evaluation_run_start", "on_eval_epoch_start", "on_eval_step_start", "on_eval_step_end",
        "on_eval_epoch_end", "on_evaluation_run_end",
    ]
    assert dict(hook.seen)["on_train_step_end"] == {"batch", "batch_output"}
    assert plain.epochs == [1, 3, "end"]


def test_the_epoch_events_run_at_the_stages_their_hook_declares_and_a_resume_begins_the_next_epoch(tmp_path):
    class EpochStart(HookBase):
        def __init__(self):
            self.starts = []

        def on_train_epoch_start(self, trainer, **kwargs):
            self.starts.append(trainer.iter)

    first = EpochStart()
    trainer = Trainer(mlp(), "sgd", loader(64, batch_size=32), lr=0.1, loss_fn=CE, max_epochs=3, hooks=[first],
                      output_dir=str(tmp_path), progress_bar=False)
    trainer.train()
    assert first.starts == [0, 2, 4]
    # The hook rule without exception: no event hook is called at an iteration where none of its events is.
    assert [c.key for c in trainer._table.calls["before_step"]] == []
    resumed = EpochStart()
    Trainer(mlp(), "sgd", loader(64, batch_size=32), lr=0.1, loss_fn=CE, max_epochs=4, hooks=[resumed],
            output_dir=str(tmp_path), progress_bar=False).train(resume=True)
    assert resumed.starts == [6]


def test_a_callbacks_unknown_on_method_is_refused_in_one_line():
    class LightningCallback(HookBase):
        def on_validation_end(self, trainer, pl_module):
            pass

    with pytest.raises(TypeError, match=r"^hooks: LightningCallback\.on_validation_end is not an event treadle "
                                        r"calls \(the events, pytorch-accelerated's: on_init_end, "):
        Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, hooks=[LightningCallback()])


def test_epoch_events_without_epochs_are_refused():
    def endless():
        while True:
            yield next(iter(loader()))

    class EpochEnd(HookBase):
        def on_train_epoch_end(self, trainer, **kwargs):
            pass

    with pytest.raises(ValueError, match=r"^train_epoch_end is called at each epoch's end .* no length"):
        Trainer(mlp(), "sgd", endless(), lr=0.1, loss_fn=CE, max_iter=2, hooks=[EpochEnd()])


# ---------------------------------------------------------------------- qurious
def test_a_qurious_train_step_with_an_l1_penalty_trains_bit_identically_to_a_hand_loop(tmp_path):
    model = mlp()
    trainer = L1Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), loss_fn=CE, max_epochs=3,
                        output_dir=str(tmp_path), progress_bar=False)
    history = trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        for x, y in loader():
            optimizer.zero_grad()
            loss = CE(by_hand(x), y) + L1Trainer.l1 * sum(p.abs().sum() for p in by_hand.parameters())
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    assert [value for _, value in history.iterations["total_loss"]] == losses
    assert history.to_dict()["epoch"] == [0, 1, 2]
    # Without the override, the penalty is not there: the weights differ.
    plain = Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_epochs=3, progress_bar=False)
    plain.train()
    assert not all(torch.equal(p, q) for p, q in zip(plain.model.parameters(), by_hand.parameters()))


def test_a_qurious_train_step_trains_each_epoch_of_train_epoch():
    model = mlp()
    counts: collections.Counter = collections.Counter()
    cls = counting_subclass("train_step", counts)
    trainer = cls(model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), loss_fn=CE, max_epochs=2,
                  progress_bar=False)
    row = trainer.train_epoch()
    assert counts["train_step"] == 4 and row["epoch"] == 0


@pytest.mark.parametrize("setting", [{"grad_accum_steps": 2}, {"clip_grad_norm": 1.0}, {"precision": "bf16"}])
def test_settings_of_treadles_update_are_refused_beside_a_train_step(setting):
    name, value = next(iter(setting.items()))
    with pytest.raises(ValueError, match=rf"^L1Trainer\.train_step does the whole update itself \(qurious' "
                                         rf"contract\), so {name}={value!r} would never act"):
        L1Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, **setting)


class ClassificationTrainer(Trainer):
    """qurious' documented example, verbatim."""

    def eval_step(self, batch):
        inputs, targets = self._prepare_batch(batch)
        outputs = self._forward_pass(inputs)
        loss = self._compute_loss(outputs, targets)

        # Calculate accuracy
        _, predicted = torch.max(outputs, 1)
        correct = (predicted == targets).sum().item()
        total = targets.size(0)
        accuracy = correct / total

        return {
            'loss': loss.item(),
            'accuracy': accuracy
        }

    def evaluate(self, dataloader):
        self.model.eval()
        total_loss = 0.0
        total_accuracy = 0.0
        steps = 0

        with torch.no_grad():
            for batch in dataloader:
                step_result = self.eval_step(batch)
                total_loss += step_result['loss']
                total_accuracy += step_result['accuracy']
                steps += 1

        return {
            'loss': total_loss / steps if steps > 0 else 0,
            'accuracy': total_accuracy / steps if steps > 0 else 0
        }


def test_quriouss_classification_trainer_runs_verbatim_with_an_evaluation_set(tmp_path):
    model = mlp()
    evaluation = loader(64, seed=1, batch_size=32)
    trainer = ClassificationTrainer(model, torch.optim.Adam(model.parameters(), lr=0.01), loader(128), loss_fn=CE,
                                    eval_loader=evaluation, max_epochs=3, best_metric="accuracy",
                                    output_dir=str(tmp_path), progress_bar=False)
    history = trainer.train().to_dict()
    assert history["epoch"] == [0, 1, 2]
    # Each epoch's accuracy is the mean of eval_step's per-batch accuracies, as qurious' evaluate computes it.
    by_hand = []
    with torch.no_grad():
        for x, y in evaluation:
            by_hand.append((trainer.model(x).argmax(1) == y).sum().item() / len(y))
    assert history["accuracy"][-1] == pytest.approx(sum(by_hand) / len(by_hand))
    assert history["accuracy"][-1] > history["accuracy"][0] and history["eval_loss"][-1] < history["eval_loss"][0]
    assert (tmp_path / "model_best.pth").exists()
    assert trainer.model.training  # the example's evaluate leaves eval mode; training restores it


def test_a_qurious_eval_step_alone_gives_the_mean_of_its_results():
    class WithEvalStep(Trainer):
        def eval_step(self, batch):
            inputs, targets = self._prepare_batch(batch)
            return {"loss": self._compute_loss(self._forward_pass(inputs), targets).item(), "batches": 1.0}

    evaluation = loader(64, seed=1, batch_size=16)
    trainer = WithEvalStep(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=evaluation, max_iter=2,
                           progress_bar=False)
    results = trainer.evaluate()
    with torch.no_grad():
        losses = [CE(trainer.model(x), y).item() for x, y in evaluation]
    assert results == {"loss": pytest.approx(sum(losses) / 4), "batches": 1.0}
    with pytest.raises(ValueError, match=r"^WithEvalStep\.eval_step computes the evaluation's results"):
        WithEvalStep(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=evaluation, metrics=["accuracy"],
                     max_iter=2)


def test_quriouss_parts_make_the_loss_of_training_and_evaluation():
    class Scaled(Trainer):
        def _compute_loss(self, outputs, targets):
            return 2 * super()._compute_loss(outputs, targets)

    trainer = Scaled(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=4, progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for x, y in loader():
        optimizer.zero_grad()
        (2 * CE(by_hand(x), y)).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))
    x, y = next(iter(loader()))
    with torch.no_grad():
        assert trainer.eval_step((x, y))["loss"] == pytest.approx(2 * CE(trainer.model(x), y).item())


# ---------------------------------------------------------------------- pytorch-accelerated
class AcceleratedStyle(Trainer):
    """Overrides of pytorch-accelerated's update methods that add to treadle's."""

    def __init__(self, *args, **kwargs):
        self.calls = []
        super().__init__(*args, **kwargs)

    def calculate_train_batch_loss(self, batch):
        xb, yb = batch
        model_outputs = self.model(xb)
        loss = self.loss_fn(model_outputs, yb) + 0.01 * model_outputs.pow(2).mean()
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": yb.size(0)}

    def backward_step(self, loss):
        self.calls.append("backward")
        super().backward_step(loss)

    def optimizer_step(self):
        self.calls.append("step")
        super().optimizer_step()

    def scheduler_step(self):
        self.calls.append("schedule")
        super().scheduler_step()

    def optimizer_zero_grad(self):
        self.calls.append("zero")
        super().optimizer_zero_grad()


def test_pytorch_accelerateds_update_methods_are_called_once_per_batch_and_update_with_accumulation():
    trainer = AcceleratedStyle(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, grad_accum_steps=2,
                               scheduler=("step", {"steps": [1], "gamma": 0.5}), progress_bar=False)
    trainer.train()
    assert trainer.calls == ["zero", "backward", "backward", "step", "schedule"] * 2
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    batches = iter(loader())
    for lr in (0.1, 0.05):
        optimizer.param_groups[0]["lr"] = lr
        optimizer.zero_grad()
        for _ in range(2):
            x, y = next(batches)
            out = by_hand(x)
            ((CE(out, y) + 0.01 * out.pow(2).mean()) / 2).backward()
        optimizer.step()
    assert all(torch.allclose(p, q, atol=1e-7) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))


class HezarThroughSuper(Trainer):
    """Hezar's training_step and optimization_step, adding to treadle's through super()."""

    def training_step(self, input_batch):
        return super().training_step(input_batch)

    def optimization_step(self):
        super().optimization_step()


@pytest.mark.parametrize("subclass", [AcceleratedStyle, HezarThroughSuper])
def test_the_seeds_default_update_methods_do_their_work_without_calling_back_into_the_step(subclass):
    """A subclass's super().backward_step(loss), super().training_step(batch)... reach the defaults, which
    do the work themselves: no call goes from them back into a method of the step (issue 53)."""
    steps_file = sys.modules[EagerStep.__module__].__file__
    defaults = {f.__code__ for f in vars(SeedOverrides).values() if inspect.isfunction(f)}
    back = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename == steps_file and frame.f_back.f_code in defaults:
            back.add(f"SeedOverrides.{frame.f_back.f_code.co_name} -> {frame.f_code.co_qualname}")

    kwargs = {"scheduler": ("step", {"steps": [1], "gamma": 0.5})} if subclass is AcceleratedStyle else {}
    trainer = subclass(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, grad_accum_steps=2, progress_bar=False,
                       **kwargs)
    sys.setprofile(profile)
    try:
        trainer.train()
    finally:
        sys.setprofile(None)
    assert back == set()


def test_scheduler_step_without_a_scheduler_is_refused():
    with pytest.raises(ValueError, match=r"^AcceleratedStyle\.scheduler_step steps the schedule, and there is none"):
        AcceleratedStyle(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2)


def test_calculate_eval_batch_loss_feeds_the_loss_and_the_metrics():
    class TrainerWithMetrics(Trainer):
        def __init__(self, *args, **kwargs):
            self.batches = 0
            super().__init__(*args, **kwargs)

        def calculate_eval_batch_loss(self, batch):
            batch_output = super().calculate_eval_batch_loss(batch)
            self.batches += 1
            return {**batch_output, "loss": batch_output["loss"] * 0 + 7.0}

    evaluation = loader(64, seed=1, batch_size=32)
    trainer = TrainerWithMetrics(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=evaluation,
                                 metrics=["loss", "accuracy"], max_iter=2, progress_bar=False)
    results = trainer.evaluate()
    with torch.no_grad():
        accuracy = sum((trainer.model(x).argmax(1) == y).sum().item() for x, y in evaluation) / 64
    assert results["loss"] == pytest.approx(7.0) and results["accuracy"] == pytest.approx(accuracy)
    assert trainer.batches == 2


# ---------------------------------------------------------------------- Hezar
def test_hezars_prepare_input_batch_and_training_step_are_called():
    class HezarStyle(Trainer):
        def __init__(self, *args, **kwargs):
            self.prepared = self.steps = 0
            super().__init__(*args, **kwargs)

        def prepare_input_batch(self, input_batch):
            self.prepared += 1
            x, y = input_batch
            return x * 2, y

        def training_step(self, input_batch):
            self.steps += 1
            return super().training_step(input_batch)

    evaluation = loader(32, seed=1)
    trainer = HezarStyle(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=evaluation, max_iter=4,
                         eval_period=0, progress_bar=False)
    trainer.train()
    assert trainer.steps == 4 and trainer.prepared == 4 + 2  # training's four batches, the final evaluation's two
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for x, y in loader():
        optimizer.zero_grad()
        CE(by_hand(x * 2), y).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))


def test_hezars_compute_loss_of_outputs_and_labels_is_the_loss():
    class HezarLoss(Trainer):
        def compute_loss(self, logits, labels):
            return nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)

    trainer = HezarLoss(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=4, progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for x, y in loader():
        optimizer.zero_grad()
        nn.functional.cross_entropy(by_hand(x), y, label_smoothing=0.1).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))


def test_hezars_compute_loss_gets_the_labels_and_the_model_the_other_keys_of_a_dict_batch():
    # Hezar's loop: outputs = model(**inputs); loss = compute_loss(logits, labels); no loss_fn.
    class HezarLoss(Trainer):
        def compute_loss(self, logits, labels):
            return nn.functional.cross_entropy(logits, labels)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()

        def forward(self, pixel_values):  # takes no labels
            return self.body(pixel_values)

    def dicts():
        return DataLoader([{"pixel_values": x, "labels": y} for x, y in loader()], batch_size=None)

    torch.manual_seed(0)
    trainer = HezarLoss(Net(), "sgd", dicts(), lr=0.1, eval_loader=dicts(), max_iter=4, progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.1)
    for x, y in loader():
        optimizer.zero_grad()
        CE(by_hand(x), y).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.body.parameters(), by_hand.parameters()))
    with torch.no_grad():
        expected = sum(CE(by_hand(x), y, reduction="sum") for x, y in loader()) / 64
    assert trainer.evaluate()["loss"] == pytest.approx(expected.item(), rel=1e-6)


def test_hezars_training_step_with_its_own_backward_averages_the_accumulated_gradients_as_hezar():
    class OwnBackward(Trainer):
        def training_step(self, input_batch):
            inputs, labels = input_batch
            loss = nn.functional.cross_entropy(self.model(inputs), labels)
            loss.backward()  # Hezar's self.accelerator.backward(loss)
            return loss.detach()

    trainer = OwnBackward(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=2, grad_accum_steps=2,
                          progress_bar=False)
    trainer.train()
    # Hezar's loop: accelerator.backward divides each micro-batch's loss by gradient_accumulation_steps.
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.5)
    batches = iter(loader())
    for _ in range(2):
        for _ in range(2):
            x, y = next(batches)
            (nn.functional.cross_entropy(by_hand(x), y) / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), by_hand.parameters()))


@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_a_hezar_training_step_without_its_backward_is_refused_at_the_first_update(tmp_path, grad_accum_steps):
    class NoBackward(Trainer):
        def training_step(self, input_batch):
            inputs, labels = input_batch
            return nn.functional.cross_entropy(self.model(inputs), labels)  # Hezar's runs its backward here

    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = NoBackward(model, "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=2, grad_accum_steps=grad_accum_steps,
                         progress_bar=False)
    with pytest.raises(TypeError) as error:
        trainer.train()
    assert str(error.value) == (
        "NoBackward.training_step returned its loss without a backward: no parameter has a gradient, so nothing "
        "would train; call loss.backward() in it (Hezar's accelerator.backward(loss)), or return "
        "super().training_step(batch)")
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_hezars_training_step_through_super_keeps_treadles_accumulation():
    class ThroughSuper(Trainer):
        def training_step(self, input_batch):
            return super().training_step(input_batch)

    trainer = ThroughSuper(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=2, grad_accum_steps=2,
                           progress_bar=False)
    trainer.train()
    plain = Trainer(mlp(), "sgd", loader(), lr=0.5, loss_fn=CE, max_iter=2, grad_accum_steps=2, progress_bar=False)
    plain.train()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), plain.model.parameters()))


def dict_loader(n=64, seed=0, batch_size=16):
    return DataLoader([{"inputs": x, "labels": y} for x, y in classification(n, seed)], batch_size=batch_size)


class WeightedLossTrainer(Trainer):
    """The Hugging Face Trainer's documented custom loss, as its users write it."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0]))
        loss = loss_fct(outputs, labels)
        return (loss, outputs) if return_outputs else loss


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = mlp()

    def forward(self, inputs):
        return self.net(inputs)


def test_the_hugging_face_compute_loss_is_called_as_the_hugging_face_trainer_calls_it():
    trainer = WeightedLossTrainer(Classifier(), "sgd", dict_loader(), lr=0.5, eval_loader=dict_loader(32, seed=1),
                                  metrics=["loss", "accuracy"], max_iter=4, eval_period=0, progress_bar=False)
    trainer.train()
    by_hand = mlp()
    optimizer = torch.optim.SGD(by_hand.parameters(), lr=0.5)
    weighted = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 3.0]))
    for x, y in loader():
        optimizer.zero_grad()
        weighted(by_hand(x), y).backward()
        optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.net.parameters(), by_hand.parameters()))
    results = trainer.evaluate()
    with torch.no_grad():
        x, y = classification(32, 1).tensors
        logits = by_hand(x)
        losses = [weighted(logits[i:i + 16], y[i:i + 16]) for i in (0, 16)]
    assert results["loss"] == pytest.approx(float(sum(losses) / 2), rel=1e-6)
    assert results["accuracy"] == pytest.approx(float((logits.argmax(1) == y).float().mean()))


def test_a_hugging_face_compute_loss_without_return_outputs_is_refused_when_built():
    class NoOutputs(Trainer):
        def compute_loss(self, model, inputs):
            return model(**inputs).sum()

    with pytest.raises(TypeError, match=r"^NoOutputs\.compute_loss\(model, inputs\) cannot be called as treadle calls "
                                        r"it, compute_loss\(model, inputs, return_outputs=\.\.\.\) \(the Hugging Face "
                                        r"Trainer's contract\)"):
        NoOutputs(Classifier(), "sgd", dict_loader(), lr=0.5, max_iter=2)


@pytest.mark.parametrize("name, fn", [
    ("optimizer_step", lambda: None),
    ("compute_loss", lambda batch: batch["labels"].sum()),
    ("train_step", lambda batch: {"loss": 0.0}),
    ("calculate_train_batch_loss", lambda batch: {"loss": 0.0}),
])
def test_a_method_set_on_the_trainer_object_is_refused_when_training_starts(name, fn, tmp_path):
    trainer = Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, output_dir=str(tmp_path / "run"),
                      progress_bar=False)
    setattr(trainer, name, fn)
    with pytest.raises(TypeError) as error:
        trainer.train()
    assert str(error.value) == (
        f"trainer.{name} was set on the Trainer object, where treadle never calls it (the methods it calls are "
        f"read from the Trainer's class when it is built): define {name} in a subclass, class MyTrainer(Trainer): "
        f"def {name}(self, ...), and build MyTrainer (docs/migrating.md)")
    assert not (tmp_path / "run").exists()


def test_an_error_inside_an_override_names_the_users_method():
    class Calc(Trainer):
        def calculate_train_batch_loss(self, batch):
            if self.iter == 7:
                raise RuntimeError("bad batch")
            return super().calculate_train_batch_loss(batch)

    trainer = Calc(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=10, progress_bar=False)
    with pytest.raises(RuntimeError, match="bad batch") as error:
        trainer.train()
    assert error.value.treadle_origin == "Calc.calculate_train_batch_loss at iteration 7"
    assert error.value.__notes__ == ["treadle: raised by Calc.calculate_train_batch_loss at iteration 7"]


def _log_metrics(trainer, epoch, metrics):
    raise ValueError("no tracker")


class _Tracker:
    def on_train_step_end(self, trainer, **kwargs):
        if trainer.iter == 5:
            raise ValueError("no tracker")


class _EpochEnd(Trainer):
    def train_epoch_end(self):
        raise ValueError("no tracker")


@pytest.mark.parametrize("cls, settings, origin", [
    (Trainer, {"callbacks": [_log_metrics]}, "callback _log_metrics at iteration 3"),
    (Trainer, {"callbacks": [_Tracker()]}, "callback _Tracker.on_train_step_end at iteration 5"),
    (_EpochEnd, {}, "_EpochEnd.train_epoch_end at iteration 3"),
])
def test_a_failing_callback_is_named_by_its_own_name(cls, settings, origin):
    """Not by the hook that called it (EpochHistory.after_epoch, TrainEvents.after_step) nor as the bare iteration."""
    trainer = cls(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_epochs=2, progress_bar=False, **settings)
    with pytest.raises(ValueError, match="no tracker") as error:
        trainer.train()
    assert error.value.treadle_origin == origin
    assert error.value.__notes__ == [f"treadle: raised by {origin}"]


# ---------------------------------------------------------------------- the page
def test_docs_migrating_shows_the_table_as_generated():
    text = (ROOT / "docs" / "migrating.md").read_text()
    assert render_markdown() in text, "docs/migrating.md is out of date: run python tools/seed_pages.py"
    for point in OVERRIDE_POINTS:
        assert f"| `{point.name}` | {point.on} | {'called' if point.called else 'refused'}: " in text
    for event in CALLBACK_EVENTS:
        assert f"`{event}(trainer, **kwargs)`" in text


# ---------------------------------------------------------------------- an override keeps exact resume
def _run_job(run_dir: Path, progress: Path, kill_after: int = 0) -> int:
    job = ROOT / "tests" / "seeds" / "qurious_l1_job.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(job), str(run_dir), "40", str(progress)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if kill_after:
        deadline = time.monotonic() + 120
        while not progress.exists() or len(progress.read_text().split()) < kill_after:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait(timeout=120)


@pytest.mark.slow
def test_a_qurious_train_step_resumes_bit_exactly_after_kill_9(tmp_path):
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    assert _run_job(reference, tmp_path / "reference.progress") == 0
    rows = [json.loads(line) for line in (reference / "metrics.json").read_text().splitlines()]
    assert [row["iteration"] for row in rows if "l1" in row] == list(range(40))  # train_step ran
    progress = tmp_path / "killed.progress"
    assert _run_job(killed, progress, kill_after=17) == -signal.SIGKILL
    assert not (killed / "model_final.pth").exists()
    before = len(progress.read_text().split())
    assert _run_job(killed, progress) == 0
    started = [int(i) for i in progress.read_text().split()]
    # Resumed from the last checkpoint (every iteration is checkpointed), not restarted.
    assert 0 < started[before] <= before and started[before:] == list(range(started[before], 40))
    a, b = (torch.load(run / "model_final.pth", map_location="cpu", weights_only=True) for run in (reference, killed))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    state_a, state_b = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(state_a[i]["momentum_buffer"], state_b[i]["momentum_buffer"]) for i in state_a)


def test_pytorch_accelerateds_trainer_with_metrics_example_runs():
    """The seed's TrainerWithMetrics, as written (torchmetrics' Accuracy now takes task=)."""
    from torchmetrics import Accuracy, MetricCollection, Precision, Recall

    class TrainerWithMetrics(Trainer):
        def __init__(self, num_classes, *args, **kwargs):
            super().__init__(*args, **kwargs)

            # this will be moved to the correct device automatically by the
            # MoveModulesToDeviceCallback callback, which is used by default
            self.metrics = MetricCollection(
                {
                    "accuracy": Accuracy(task="multiclass", num_classes=num_classes),
                    "precision": Precision(task="multiclass", num_classes=num_classes),
                    "recall": Recall(task="multiclass", num_classes=num_classes),
                }
            )

        def calculate_eval_batch_loss(self, batch):
            batch_output = super().calculate_eval_batch_loss(batch)
            preds = batch_output["model_outputs"].argmax(dim=-1)

            self.metrics.update(preds, batch[1])

            return batch_output

        def eval_epoch_end(self):
            metrics = self.metrics.compute()
            self.run_history.update_metric("accuracy", metrics["accuracy"].cpu())
            self.run_history.update_metric("precision", metrics["precision"].cpu())
            self.run_history.update_metric("recall", metrics["recall"].cpu())

            self.metrics.reset()

    evaluation = loader(64, seed=1, batch_size=16)
    trainer = TrainerWithMetrics(2, mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=evaluation,
                                 max_epochs=2, progress_bar=False)
    history = trainer.train().to_dict()
    with torch.no_grad():
        accuracy = sum((trainer.model(x).argmax(1) == y).sum().item() for x, y in evaluation) / 64
    values = trainer.run_history.get_metric_values("accuracy")
    assert len(values) == 2 and float(values[-1]) == pytest.approx(accuracy)
    assert history["accuracy"] == pytest.approx([float(v) for v in values])
    assert len(history["eval_loss"]) == 2  # the loss of calculate_eval_batch_loss, evaluated as before


# ---------------------------------------------------------------------- what a seed's user writes inside an override
def qurious_update(trainer, batch):
    inputs, targets = trainer._prepare_batch(batch)
    trainer.optimizer.zero_grad()
    loss = trainer._compute_loss(trainer._forward_pass(inputs), targets)
    loss.backward()
    trainer.optimizer.step()
    return {"loss": loss.item()}


class SteppingItsSchedule(Trainer):
    """qurious' update, stepping its scheduler as a qurious user writes it."""

    def train_step(self, batch):
        results = qurious_update(self, batch)
        self.scheduler.step()
        return results


class SteppingBySchedulerStep(Trainer):
    def train_step(self, batch):
        results = qurious_update(self, batch)
        self.scheduler_step()  # pytorch-accelerated's
        return results


@pytest.mark.parametrize("cls, call", [(SteppingItsSchedule, "self.scheduler.step()"),
                                       (SteppingBySchedulerStep, "self.scheduler_step()")])
def test_a_train_step_that_steps_the_schedule_too_is_refused_when_built(cls, call, tmp_path):
    """qurious' update steps its scheduler; treadle's hook steps it too: twice per iteration, silently."""
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as error:
        cls(model, optimizer, loader(), loss_fn=CE, max_iter=4, progress_bar=False, output_dir=str(tmp_path / "run"),
            scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5))
    assert str(error.value) == (
        f"{cls.__name__}.train_step steps the learning-rate schedule ({call}), which treadle's LRScheduler hook "
        "steps after each iteration (each epoch with scheduler_interval='epoch'): remove that call, and give the "
        "schedule as scheduler=")
    assert not (tmp_path / "run").exists()


def test_a_schedule_stepped_where_the_build_cannot_see_it_is_refused_at_the_first_iteration():
    """The schedule's hook still finds a step() it did not make (here through a helper of train_step)."""

    class ByHelper(Trainer):
        def train_step(self, batch):
            results = qurious_update(self, batch)
            self.advance()
            return results

        def advance(self):
            self.scheduler.step()

    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ByHelper(model, optimizer, loader(), loss_fn=CE, max_iter=4, progress_bar=False,
                       scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 3, 0.5))
    with pytest.raises(RuntimeError, match=r"^The learning-rate schedule \(StepLR\) was stepped 1 more time\(s\) since "
                                           r"the LRScheduler hook last stepped it, by something else"):
        trainer.train()
    assert trainer.iter == 0


@pytest.mark.parametrize("name", ["accelerator", "_accelerator"])
def test_self_accelerator_in_an_override_says_what_to_write(name):
    class AcceleratorBackward(Trainer):
        def training_step(self, input_batch):
            inputs, labels = input_batch
            loss = CE(self.model(inputs), labels)
            getattr(self, name).backward(loss)  # Hezar's self.accelerator, pytorch-accelerated's self._accelerator
            return loss

    trainer = AcceleratorBackward(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, progress_bar=False)
    with pytest.raises(AttributeError) as error:
        trainer.train()
    assert str(error.value) == (
        f"AcceleratorBackward.{name}: treadle has no accelerator (Hugging Face Accelerate's, which Hezar's and "
        f"pytorch-accelerated's trainers hold): for self.{name}.backward(loss) write self.backward_step(loss) "
        "(super().backward_step(loss) inside backward_step), which scales the loss under fp16 and averages the "
        "gradients under grad_accum_steps; autocast, devices and processes are the precision=, device= and ddp= "
        "settings")
    assert not hasattr(trainer, name)


def test_a_subclass_keeps_an_accelerator_of_its_own():
    class OwnAccelerator(Trainer):
        def __init__(self, *args, **kwargs):
            self.accelerator = "mine"
            super().__init__(*args, **kwargs)

    assert OwnAccelerator(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2).accelerator == "mine"


def test_metrics_see_the_targets_where_prepare_batch_finds_them():
    class DictSamples(Trainer):
        def _prepare_batch(self, batch):
            return batch["x"].to(self.device), batch["y"].to(self.device)

    data = [{"x": x, "y": y} for x, y in classification(64, seed=1)]
    trainer = DictSamples(mlp(), "sgd", [{"x": x, "y": y} for x, y in classification(64)], batch_size=16, lr=0.1,
                          loss_fn=CE, eval_loader=data, metrics=["loss", "accuracy"], max_iter=2, progress_bar=False)
    trainer.train()
    with torch.no_grad():
        x = torch.stack([d["x"] for d in data])
        y = torch.stack([d["y"] for d in data])
        accuracy = (trainer.model(x).argmax(1) == y).float().mean().item()
        loss = CE(trainer.model(x), y).item()
    results = trainer.evaluate()
    assert results["accuracy"] == pytest.approx(accuracy) and results["loss"] == pytest.approx(loss, rel=1e-5)


def test_pytorch_accelerateds_loss_func_and_print_are_there(capsys):
    class AcceleratedBody(Trainer):
        def calculate_train_batch_loss(self, batch):
            xb, yb = batch
            model_outputs = self.model(xb)
            self.print("batch of", yb.size(0))
            return {"loss": self.loss_func(model_outputs, yb), "model_outputs": model_outputs,
                    "batch_size": yb.size(0)}

    AcceleratedBody(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, progress_bar=False).train()
    assert capsys.readouterr().out.count("batch of 16\n") == 2


def test_a_broken_return_contract_names_the_users_class():
    class FloatStep(Trainer):
        def train_step(self, batch):
            return 0.5

    with pytest.raises(TypeError, match=r"^FloatStep\.train_step must return a dict with a 'loss'"):
        FloatStep(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, progress_bar=False).train()


def test_an_override_that_cannot_take_the_seeds_arguments_is_refused_when_built():
    class OneArgument(Trainer):
        def _compute_loss(self, outputs):
            return outputs.sum()

    with pytest.raises(TypeError, match=r"^OneArgument\._compute_loss\(outputs\) cannot be called as treadle calls it, "
                                        r"_compute_loss\(outputs, targets\) \(qurious' contract\)"):
        OneArgument(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2)

    class NoBatch:
        def on_train_step_end(self, trainer):
            pass

    with pytest.raises(TypeError, match=r"^callbacks: NoBatch\.on_train_step_end\(trainer\) cannot be called as treadle "
                                        r"calls it, on_train_step_end\(trainer, batch=\.\.\., batch_output=\.\.\.\)"):
        Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, callbacks=[NoBatch()])


class PrintEpochEnd:
    """A callback as pytorch-accelerated's users write one: an on_* event taking the trainer."""

    def on_train_epoch_end(self, trainer):
        print(f"epoch {trainer.epoch} ended")


def test_a_callback_that_cannot_be_called_is_refused_when_built_before_anything_is_written(tmp_path):
    """Before: built, the first epoch trained and wrote its files, then Python's TypeError."""
    def log_metrics_callback(trainer):  # qurious' callback is (trainer, epoch, metrics)
        pass

    out = tmp_path / "run"
    for callback, message in [
        (log_metrics_callback, "callbacks: log_metrics_callback(trainer) cannot be called as treadle calls it, "
                               "log_metrics_callback(trainer, epoch, metrics) (qurious' callback at each epoch's end; "
                               "or an object with pytorch-accelerated's on_* events); see docs/migrating.md"),
        (lambda trainer: None, "callbacks: <lambda>(trainer) cannot be called as treadle calls it, "
                               "<lambda>(trainer, epoch, metrics) (qurious' callback at each epoch's end; "
                               "or an object with pytorch-accelerated's on_* events); see docs/migrating.md"),
        (PrintEpochEnd, "callbacks: PrintEpochEnd is a class: give an instance, callbacks=[PrintEpochEnd()] "
                        "(a callback object's on_* events are called with the trainer)"),
    ]:
        with pytest.raises(TypeError) as error:
            Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_epochs=2, output_dir=str(out),
                    callbacks=[callback])
        assert str(error.value) == message
        assert not out.exists()


def test_a_callback_given_as_a_hook_is_pointed_to_callbacks(tmp_path):
    def log_metrics_callback(trainer, epoch, metrics):
        pass

    out = tmp_path / "run"
    for hook, message in [
        (log_metrics_callback, "hooks: log_metrics_callback is a callback, not a hook (HookBase): give it as "
                               "callbacks=[log_metrics_callback] (fn(trainer, epoch, metrics) at each epoch's end, or "
                               "an object with pytorch-accelerated's on_* events)"),
        (PrintEpochEnd(), "hooks: PrintEpochEnd is a callback, not a hook (HookBase): give it as "
                          "callbacks=[PrintEpochEnd()] (fn(trainer, epoch, metrics) at each epoch's end, or "
                          "an object with pytorch-accelerated's on_* events)"),
    ]:
        with pytest.raises(ValueError) as error:
            Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_epochs=2, output_dir=str(out), hooks=[hook])
        assert str(error.value) == message
        assert not out.exists()


def test_quriouss_history_indexing_and_train_after_train_epoch_say_what_to_do():
    trainer = Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, max_epochs=2, progress_bar=False)
    trainer.train_epoch()
    history = trainer.train_epoch() and trainer.history
    with pytest.raises(KeyError, match=r"'train_loss' is a value per epoch: history.to_dict\(\)\['train_loss'\]"):
        history["train_loss"]
    with pytest.raises(RuntimeError, match=r"^train_epoch\(\) has trained every epoch of the run \(to iteration 7, "
                                           r"max_iter=8\): there is nothing left for train\(\)"):
        trainer.train()


def test_best_metric_may_name_a_result_recorded_by_run_history(tmp_path):
    class Recording(Trainer):
        def eval_epoch_end(self):
            self.run_history.update_metric("my_score", 10.0 - len(self.run_history.get_metric_values("my_score")))

    trainer = Recording(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=loader(32, seed=1), max_epochs=3,
                        best_metric="my_score", best_mode="max", output_dir=str(tmp_path), progress_bar=False)
    history = trainer.train().to_dict()
    assert history["my_score"] == [10.0, 9.0, 8.0]
    best = torch.load(tmp_path / "model_best.pth", weights_only=True)
    assert best["iteration"] == 3  # the first evaluation's, after iteration 3


def test_run_history_holds_the_losses_by_default_as_pytorch_accelerateds():
    seen = []

    class PrintMetrics:
        def on_eval_epoch_end(self, trainer, **kwargs):
            seen.append(trainer.run_history.get_latest_metric("eval_loss_epoch"))

    trainer = Trainer(mlp(), "sgd", loader(), lr=0.1, loss_fn=CE, eval_loader=loader(32, seed=1), max_epochs=2,
                      callbacks=[PrintMetrics()], progress_bar=False)
    history = trainer.train().to_dict()
    assert seen == pytest.approx(history["eval_loss"])
    assert trainer.run_history.get_metric_values("train_loss_epoch") == history["train_loss"]


def test_a_plain_trainers_training_step_called_by_hand_is_the_batchs_loss_and_its_backward():
    """Hezar's ``training_step`` on a Trainer that overrides nothing (its step a
    plain EagerStep): the loss, and gradients of the loss over grad_accum_steps."""
    model, batch = mlp(), next(iter(loader()))
    by_hand = copy.deepcopy(model)
    trainer = Trainer(model, "sgd", loader(), lr=0.1, loss_fn=CE, max_iter=2, grad_accum_steps=2, progress_bar=False)
    loss = trainer.training_step(batch)
    expected = CE(by_hand(batch[0]), batch[1])
    (expected / 2).backward()
    assert torch.equal(loss.detach(), expected.detach())
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), by_hand.parameters()))
