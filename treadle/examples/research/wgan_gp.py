"""WGAN-GP as a step object: the critic trained ``n_critic`` times per generator update.

One iteration is one generator update: before it, the critic takes
``n_critic`` updates, each on a batch of its own from the step's
:class:`~treadle.data.DataStream`, with the gradient penalty of Gulrajani
et al. (2017): the norm of the critic's gradient with respect to its
input, at points between real and generated samples, pulled to 1. That
gradient is taken with ``torch.autograd.grad(create_graph=True)`` so that
the penalty itself is differentiated by the critic's backward. Run it::

    python -m treadle.examples.research.wgan_gp --output-dir out/wgan --max-iter 20 [--resume]
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from treadle.checkpoint import Checkpointer
from treadle.data import DataStream
from treadle.engine import StepBase, TrainerBase, Update
from treadle.events import ScalarKind
from treadle.examples.research import job
from treadle.utils.env import seed_all_rng

__all__ = ["WGANGPStep", "gradient_penalty", "build_data", "build_models", "main"]

SEED, LATENT, BATCH, N_CRITIC, GP_WEIGHT = 0, 4, 8, 3, 10.0


def gradient_penalty(critic: nn.Module, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """``mean((||d critic(x) / dx|| - 1)^2)`` at random points ``x`` between ``real`` and ``fake``."""
    eps = torch.rand(real.shape[0], 1)
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    return ((grad.norm(2, dim=1) - 1) ** 2).mean()


class WGANGPStep(StepBase):
    """``n_critic`` critic updates, then one generator update.

    Publishes ``critic_loss``, ``gradient_penalty`` and ``wasserstein`` (the
    critic's estimate, of its last update) and ``g_loss``.
    """

    def __init__(self, g: nn.Module, critic: nn.Module, loader: DataLoader, opt_g: torch.optim.Optimizer,
                 opt_c: torch.optim.Optimizer, n_critic: int = N_CRITIC) -> None:
        if n_critic < 1:
            raise ValueError(f"n_critic must be >= 1, got {n_critic}")
        self.g, self.critic, self.n_critic = g, critic, n_critic
        self.data = DataStream(loader)
        self.update_g, self.update_c = Update(opt_g), Update(opt_c)

    def run_step(self) -> None:
        for _ in range(self.n_critic):
            (real,) = next(self.data)
            with torch.no_grad():
                fake = self.g(torch.randn(real.shape[0], LATENT))
            wasserstein = self.critic(real).mean() - self.critic(fake).mean()
            penalty = gradient_penalty(self.critic, real, fake)
            critic_loss = -wasserstein + GP_WEIGHT * penalty
            self.update_c.apply(critic_loss, self.after_backward)

        g_loss = -self.critic(self.g(torch.randn(BATCH, LATENT))).mean()
        self.update_g.apply(g_loss, self.after_backward)
        for name, value in (("critic_loss", critic_loss), ("gradient_penalty", penalty),
                            ("wasserstein", wasserstein), ("g_loss", g_loss)):
            self.storage.put_scalar(name, value.detach(), kind=ScalarKind.LOSS)


def build_data() -> DataLoader:
    """Points of a ring in 2D (the real data), shuffled per pass."""
    angles = torch.rand(64, generator=torch.Generator().manual_seed(SEED)) * 6.2832
    points = torch.stack([angles.cos(), angles.sin()], dim=1)
    return DataLoader(TensorDataset(points), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(SEED))


def build_models() -> List[nn.Module]:
    """The generator and the critic (no normalization in the critic: the penalty is per sample)."""
    g = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 2))
    critic = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    return [g, critic]


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    args = job.parse_args(__doc__, argv)
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    seed_all_rng(SEED)
    g, critic = build_models()
    opt_g = torch.optim.Adam(g.parameters(), lr=1e-3, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.0, 0.9))
    trainer = TrainerBase(WGANGPStep(g, critic, build_data(), opt_g, opt_c))
    checkpointer = Checkpointer(g, args.output_dir, critic=critic, opt_g=opt_g, opt_c=opt_c, trainer=trainer)
    job.train(trainer, checkpointer, args)


if __name__ == "__main__":
    main()
