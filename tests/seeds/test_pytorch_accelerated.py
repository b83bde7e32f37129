"""pytorch-accelerated's ``Trainer`` documentation, translated to treadle.

Source: ``shared/seeds/002_*.txt``: ``create_scheduler_fn``, placeholders,
the torchmetrics subclass example, callbacks (``on_*``), ``RunHistory``,
``calculate_train_batch_loss``, ``save_checkpoint``/``load_checkpoint``.
Names: ``docs/coming_from/pytorch_accelerated.md``.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision, MulticlassRecall

from treadle.engine import HookBase
from treadle.trainer import Trainer


def classification(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    return torch.utils.data.TensorDataset(x, y)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))


def test_scheduler_from_create_scheduler_fn_and_metrics_from_torchmetrics():
    """``create_scheduler_fn = partial(lr_scheduler.StepLR, step_size=7, gamma=0.1)``, a
    factory of the optimizer; the ``TrainerWithMetrics`` subclass becomes a metric collection."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    create_scheduler_fn = partial(lr_scheduler.StepLR, step_size=7, gamma=0.1)
    metrics = MetricCollection(
        {
            "accuracy": MulticlassAccuracy(num_classes=3),
            "precision": MulticlassPrecision(num_classes=3),
            "recall": MulticlassRecall(num_classes=3),
        }
    )
    trainer = Trainer(net, optimizer, classification(), loss_fn=nn.functional.cross_entropy, batch_size=32,
                      eval_loader=classification(96, seed=1), eval_batch_size=32, metrics=["loss", metrics],
                      max_epochs=8, scheduler=create_scheduler_fn, scheduler_interval="epoch", progress_bar=False, seed=0)
    history = trainer.train()
    # RunHistory: the metric per epoch.
    accuracy = history.to_dict()["accuracy"]
    assert len(accuracy) == 8 and all(isinstance(a, float) for a in accuracy)
    assert accuracy[-1] > 0.6
    lrs = history.to_dict()["lr"]
    assert lrs[:7] == pytest.approx([0.1] * 7) and lrs[7] == pytest.approx(0.01)


def test_callbacks_are_hooks_and_see_each_epoch():
    """``on_train_epoch_end`` / ``on_eval_epoch_end``: a hook's ``after_epoch``."""

    class PrintMetricsCallback(HookBase):
        def __init__(self):
            self.lines = []

        def after_epoch(self):
            row = self.trainer.history.epochs[-1]
            self.lines.append(f"epoch {self.trainer.epoch}: train_loss={row['train_loss']:.3f} eval_loss={row['eval_loss']:.3f}")

    callback = PrintMetricsCallback()
    trainer = Trainer(model(), "adam", classification(), lr=1e-2, batch_size=32, loss_fn=nn.functional.cross_entropy,
                      eval_loader=classification(64, seed=1), max_epochs=3, hooks=[callback], progress_bar=False)
    trainer.train()
    assert [line.split(":")[0] for line in callback.lines] == ["epoch 0", "epoch 1", "epoch 2"]


def test_calculate_train_batch_loss_is_compute_loss(tmp_path):
    class LabelSmoothingTrainer(Trainer):
        def compute_loss(self, batch):
            x, y = batch
            return nn.functional.cross_entropy(self.model(x), y, label_smoothing=0.1)

    trainer = LabelSmoothingTrainer(model(), "sgd", classification(), lr=0.1, batch_size=32, max_epochs=2,
                                    precision="bf16", grad_accum_steps=2, clip_grad_norm=1.0, progress_bar=False)
    history = trainer.train()
    assert history.epochs[-1]["train_loss"] < history.epochs[0]["train_loss"]

    trainer.save_checkpoint(str(tmp_path / "checkpoint.pt"))
    restored = Trainer(model(), "sgd", classification(), lr=0.1, batch_size=32, max_epochs=2, progress_bar=False)
    restored.load_checkpoint(str(tmp_path / "checkpoint.pt"))
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), restored.model.parameters()))
