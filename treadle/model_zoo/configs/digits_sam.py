"""A research loop from the config: the digits example trained with
sharpness-aware minimization, by replacing the step object
(``treadle/examples/sam.py``). Everything else is ``digits_mlp.py``'s."""

import torch

from treadle.config import LazyCall as L
from treadle.examples import SAMStep

from .digits_mlp import dataloader, lr_multiplier, model, optimizer, train

train.output_dir = "./output/digits_sam"
# A node with _target_ replaces the step: DefaultTrainer passes it the model,
# the train loader and the optimizer.
train.step = L(SAMStep)(loss_fn=L(torch.nn.CrossEntropyLoss)(), rho=0.05)
