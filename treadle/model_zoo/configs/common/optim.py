"""Optimizers. ``params`` receives the model from ``DefaultTrainer``: norms and
biases go to a group without weight decay.

The decayed group reads the optimizer's ``weight_decay`` (``${..weight_decay}``):
every group sets its own value, so a literal here would make the override
``optimizer.weight_decay=...`` change nothing.
"""

import torch

from treadle.config import LazyCall as L
from treadle.solver import get_param_groups

SGD = L(torch.optim.SGD)(
    params=L(get_param_groups)(weight_decay="${..weight_decay}", weight_decay_norm=0.0, weight_decay_bias=0.0),
    lr=0.1,
    momentum=0.9,
    weight_decay=1e-4,
)

AdamW = L(torch.optim.AdamW)(
    params=L(get_param_groups)(weight_decay="${..weight_decay}", weight_decay_norm=0.0, weight_decay_bias=0.0),
    lr=1e-3,
    betas=(0.9, 0.999),
    weight_decay=0.05,
)
