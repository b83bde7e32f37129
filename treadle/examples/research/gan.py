"""A GAN as a step object: two models, two optimizers, two updates, two schedules.

One iteration trains the discriminator on a real batch and a generated one,
then the generator through the discriminator. The step holds its data as a
:class:`~treadle.data.DataStream` and one :class:`~treadle.engine.Update`
per optimizer; the trainer's checkpoint keeps both models, both optimizers,
both schedules, the data position and the random state, so a run killed at
any iteration resumes bit-exact. Run it::

    python -m treadle.examples.research.gan --output-dir out/gan --max-iter 40 [--resume] [--num-gpus 2]
"""

from __future__ import annotations

import argparse
from typing import List, Optional

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits as bce
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from treadle.checkpoint import Checkpointer
from treadle.data import DataStream
from treadle.engine import StepBase, TrainerBase, Update, create_ddp_model, launch
from treadle.events import ScalarKind
from treadle.examples.research import job
from treadle.hooks import LRScheduler
from treadle.utils import comm
from treadle.utils.env import seed_all_rng

__all__ = ["GANStep", "build_data", "build_models", "main"]

SEED, LATENT, BATCH = 0, 4, 8


class GANStep(StepBase):
    """One discriminator update, then one generator update (the non-saturating loss).

    Publishes ``d_loss`` and ``g_loss``. The discriminator sees the real and
    the generated batch in one forward: one pass through a DDP-wrapped ``d``.
    """

    def __init__(self, g: nn.Module, d: nn.Module, loader: DataLoader,
                 opt_g: torch.optim.Optimizer, opt_d: torch.optim.Optimizer) -> None:
        self.g, self.d = g, d
        self.data = DataStream(loader)
        self.update_g, self.update_d = Update(opt_g, model=g), Update(opt_d, model=d)

    def run_step(self) -> None:
        (real,) = next(self.data)
        fake = self.g(torch.randn(real.shape[0], LATENT))
        logits = self.d(torch.cat([real, fake.detach()]))
        labels = torch.cat(
            [torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)]
        )
        d_loss = bce(logits, labels)
        self.update_d.apply(d_loss, self.after_backward)

        g_loss = bce(self.d(fake), torch.ones(real.shape[0], 1))
        self.update_g.apply(g_loss, self.after_backward)
        self.storage.put_scalar("d_loss", d_loss.detach(), kind=ScalarKind.LOSS)
        self.storage.put_scalar("g_loss", g_loss.detach(), kind=ScalarKind.LOSS)


def build_data(world_size: int = 1, rank: int = 0) -> DataLoader:
    """Points of a ring in 2D (the real data), this rank's share, shuffled per pass."""
    angles = torch.rand(64, generator=torch.Generator().manual_seed(SEED)) * 6.2832
    points = torch.stack([angles.cos(), angles.sin()], dim=1)
    dataset = TensorDataset(points)
    sampler: DistributedSampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=SEED)
    return DataLoader(dataset, batch_size=BATCH // world_size, sampler=sampler)


def build_models() -> List[nn.Module]:
    """The generator and the discriminator (drawn from torch's seeded generator)."""
    g = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 2))
    d = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return [g, d]


def train(args: argparse.Namespace) -> None:
    """Builds the job on this process (one of ``--num-gpus``) and trains it."""
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    # The seed of each rank its own: each draws its own noise (DDP copies rank 0's weights).
    seed_all_rng(SEED + comm.get_rank())
    g, d = build_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-3, betas=(0.5, 0.999))
    sched_g = torch.optim.lr_scheduler.StepLR(opt_g, step_size=10, gamma=0.5)
    sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, gamma=0.97)
    loader = build_data(comm.get_world_size(), comm.get_rank())
    trainer = TrainerBase(GANStep(create_ddp_model(g), create_ddp_model(d), loader, opt_g, opt_d))
    checkpointer = Checkpointer(g, args.output_dir, d=d, opt_g=opt_g, opt_d=opt_d, trainer=trainer)
    # Each rate under its own name: two hooks publishing one scalar are refused when registered.
    schedules = [LRScheduler(opt_g, sched_g, name="lr_g"), LRScheduler(opt_d, sched_d, name="lr_d")]
    job.train(trainer, checkpointer, args, schedules)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    args = job.parse_args(__doc__, argv, processes=True)
    launch(train, args.num_gpus, args=(args,))


if __name__ == "__main__":
    main()
