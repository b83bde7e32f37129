"""A detectron2-style lazy config (its keys: train.amp, train.ddp,
train.checkpointer as keyword arguments) for the digits example, built from
treadle's pieces and detectron2's names (treadle.solver's)."""

import os
import time

import torch
from fvcore.common.param_scheduler import MultiStepParamScheduler
from torch import nn

from treadle.config import LazyCall as L
from treadle.config import get_config
from treadle.models import MLPClassifier
from treadle.solver import WarmupParamScheduler, get_default_optimizer_params

dataloader = get_config("common/data/digits.py").dataloader
dataloader.evaluator.loss_fn = L(torch.nn.CrossEntropyLoss)()



class DigitsClassifier(nn.Module):
    """A detectron2-style model: a dict of losses in training, predictions in eval."""

    def __init__(self):
        super().__init__()
        self.net = MLPClassifier(input_dim=64, num_classes=10, hidden_dims=(64,), dropout=0.0)

    def forward(self, batched_inputs):
        if not self.training:
            return self.net(batched_inputs)
        _pause_if_asked()
        images, labels = batched_inputs
        return {"loss_cls": nn.functional.cross_entropy(self.net(images), labels)}


def _pause_if_asked():
    """For the tests: at iteration D2_PAUSE_AT, create the file D2_PAUSE_MARKER
    and wait there (the test kills the job with kill -9)."""
    from treadle.events import get_event_storage

    at, marker = os.environ.get("D2_PAUSE_AT"), os.environ.get("D2_PAUSE_MARKER")
    if at is None or marker is None or get_event_storage().iter != int(at):
        return
    with open(marker, "w") as f:
        f.write(at)
    time.sleep(600)


model = L(DigitsClassifier)()

optimizer = L(torch.optim.SGD)(
    params=L(get_default_optimizer_params)(weight_decay_norm=0.0), lr=0.05, momentum=0.9, weight_decay=1e-4
)

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(MultiStepParamScheduler)(values=[1.0, 0.1], milestones=[30], num_updates=40),
    warmup_length=5 / 40,
    warmup_factor=0.001,
)

train = dict(
    output_dir="./output/d2_digits",
    init_checkpoint="",
    max_iter=40,
    amp=dict(enabled=False),
    ddp=dict(broadcast_buffers=False, find_unused_parameters=False, fp16_compression=False),
    checkpointer=dict(period=10, max_to_keep=100),
    eval_period=20,
    log_period=10,
    device="cpu",
    seed=0,
)
