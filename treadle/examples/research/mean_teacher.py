"""Mean teacher (BYOL's target network): a target that is the average of the online weights.

An online network is trained by the optimizer; after each update a target
network moves towards it, ``target = m * target + (1 - m) * online``
(one ``foreach_lerp_`` over the parameters, under ``no_grad``). The loss is
the cross-entropy on the labels plus a consistency term between the online
network's predictions on one noisy view of the batch and the target's on
another (Tarvainen & Valpola, 2017). The noise comes from torch's global
generator, whose state every checkpoint keeps; the target's weights are
saved under ``target`` (a network: loadable alone, as the one to evaluate)::

    python -m treadle.examples.research.mean_teacher --output-dir D --max-iter 40 [--resume]
"""

from __future__ import annotations

import argparse
import copy
from typing import Iterable, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from treadle.checkpoint import Checkpointer
from treadle.data import DataStream
from treadle.engine import StepBase, TrainerBase, Update
from treadle.events import ScalarKind
from treadle.examples.research import job
from treadle.utils.env import seed_all_rng
from treadle.utils.torch_internals import foreach_lerp_

__all__ = ["MeanTeacherStep", "train", "main"]

SEED = 0


class MeanTeacherStep(StepBase):
    """One online update on
    ``CE + weight * MSE(softmax(online(view_a)), softmax(target(view_b)))``,
    then the target's moving average of the online weights."""

    def __init__(
        self,
        online: nn.Module,
        target: nn.Module,
        loader: Iterable,
        optimizer: torch.optim.Optimizer,
        *,
        momentum: float = 0.9,
        noise: float = 0.2,
        weight: float = 1.0,
    ) -> None:
        self.online, self.target = online, target.requires_grad_(False)
        self.data = DataStream(loader)
        self.update = Update(optimizer)
        self.momentum, self.noise, self.weight = momentum, noise, weight
        self.target_params = list(target.parameters())
        self.online_params = list(online.parameters())

    def run_step(self) -> None:
        inputs, labels = next(self.data)
        view_a = inputs + self.noise * torch.randn_like(inputs)
        view_b = inputs + self.noise * torch.randn_like(inputs)
        logits = self.online(view_a)
        with torch.no_grad():
            target_probs = self.target(view_b).softmax(dim=1)
        loss_ce = F.cross_entropy(logits, labels)
        loss_consistency = F.mse_loss(logits.softmax(dim=1), target_probs)
        loss = loss_ce + self.weight * loss_consistency
        self.update.apply(loss, self.after_backward)
        with torch.no_grad():
            foreach_lerp_(self.target_params, self.online_params, 1 - self.momentum)
        losses = (
            ("total_loss", loss),
            ("loss_ce", loss_ce),
            ("loss_consistency", loss_consistency),
        )
        for name, value in losses:
            self.storage.put_scalar(name, value.detach(), kind=ScalarKind.LOSS)


def train(args: argparse.Namespace) -> None:
    """Builds the job, seeded the same in every run, and trains it."""
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    seed_all_rng(SEED)
    inputs = torch.randn(64, 8)
    labels = (inputs @ torch.randn(8, 4)).argmax(dim=1)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(SEED))
    online = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    target = copy.deepcopy(online)
    optimizer = torch.optim.SGD(online.parameters(), lr=0.1, momentum=0.9)
    trainer = TrainerBase(MeanTeacherStep(online, target, loader, optimizer))
    checkpointer = Checkpointer(online, args.output_dir, optimizer=optimizer, target=target, trainer=trainer)
    job.train(trainer, checkpointer, args)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    train(job.parse_args(__doc__, argv))


if __name__ == "__main__":
    main()
