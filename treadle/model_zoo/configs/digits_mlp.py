"""Handwritten digits (UCI 8x8, shipped with treadle) with a small MLP.

The default job of ``python tools/train_net.py``: 1500 iterations, >= 95%
test accuracy (its time on a CPU: the README's quick start).
"""

import torch

from treadle.config import LazyCall as L
from treadle.models import MLPClassifier

from .common.data.digits import dataloader
from .common.optim import SGD as optimizer
from .common.schedules import cosine_with_warmup as lr_multiplier
from .common.train import train

model = L(MLPClassifier)(input_dim=64, num_classes=10, hidden_dims=(256, 128), dropout=0.1)

optimizer.lr = 0.05

train.output_dir = "./output/digits_mlp"
train.max_iter = 1500
train.eval_period = 300
train.checkpointer.period = 500
train.step.loss_fn = L(torch.nn.CrossEntropyLoss)()
train.best_checkpointer.metric = "accuracy"

dataloader.evaluator.loss_fn = L(torch.nn.CrossEntropyLoss)()
