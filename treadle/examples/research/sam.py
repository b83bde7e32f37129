"""Sharpness-aware minimization (SAM) with an EMA of the weights, as a job.

The step is :class:`treadle.examples.sam.SAMStep` (the one
``configs/digits_sam.py`` trains with): two forward/backward passes per
update, the second at the weights moved ``rho`` along the normalized
gradient, whose gradient then updates the weights. The
:class:`~treadle.hooks.EMA` hook keeps an average of the weights after
every update; its average and count are saved with the trainer, so a
resumed run averages on exactly. Run it::

    python -m treadle.examples.research.sam --output-dir out/sam --max-iter 30 [--resume]
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from treadle.checkpoint import Checkpointer
from treadle.engine import TrainerBase
from treadle.examples.research import job
from treadle.examples.sam import SAMStep
from treadle.hooks import EMA
from treadle.utils.env import seed_all_rng

__all__ = ["SAMStep", "build_data", "build_model", "main"]

SEED, BATCH, RHO, EMA_DECAY = 0, 16, 0.05, 0.9


def build_data() -> DataLoader:
    """Three classes of 8-dimensional points, split by a random linear map; shuffled per pass."""
    g = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(96, 8, generator=g)
    labels = (inputs @ torch.randn(8, 3, generator=g)).argmax(dim=1)
    return DataLoader(TensorDataset(inputs, labels), batch_size=BATCH, shuffle=True,
                      generator=torch.Generator().manual_seed(SEED))


def build_model() -> nn.Module:
    """The classifier SAM trains (drawn from torch's seeded generator)."""
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    args = job.parse_args(__doc__, argv)
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    seed_all_rng(SEED)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = SAMStep(
        model, build_data(), optimizer, loss_fn=nn.functional.cross_entropy, rho=RHO
    )
    trainer = TrainerBase(step)
    checkpointer = Checkpointer(
        model, args.output_dir, optimizer=optimizer, trainer=trainer
    )
    # Before the checkpointer (job.train registers it after these): it saves this iteration's average.
    job.train(trainer, checkpointer, args, [EMA(EMA_DECAY, model=model)])


if __name__ == "__main__":
    main()
