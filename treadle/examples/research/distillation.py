"""Knowledge distillation: a student trained on a frozen teacher's soft targets.

The loss mixes the KL divergence between the teacher's and the student's
distributions softened by a temperature ``T`` (scaled by ``T**2``, so that
its gradients keep their size as ``T`` changes; Hinton et al., 2015) with
the cross-entropy on the labels. The teacher is built in ``main``, in eval
mode, without gradients; it is saved in each checkpoint under ``teacher``
so that a resume needs nothing but the run's folder (a teacher read from a
file that never changes could be left out: training never changes it)::

    python -m treadle.examples.research.distillation --output-dir D --max-iter 40 [--resume]
"""

from __future__ import annotations

import argparse
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

__all__ = ["DistillationStep", "mlp", "train", "main"]

SEED = 0


class DistillationStep(StepBase):
    """One student update on
    ``alpha * T**2 * KL(teacher || student at T) + (1 - alpha) * CE``."""

    def __init__(
        self,
        student: nn.Module,
        teacher: nn.Module,
        loader: Iterable,
        optimizer: torch.optim.Optimizer,
        *,
        temperature: float = 4.0,
        alpha: float = 0.7,
    ) -> None:
        self.student, self.teacher = student, teacher.eval().requires_grad_(False)
        self.data = DataStream(loader)
        self.update = Update(optimizer)
        self.temperature, self.alpha = temperature, alpha

    def run_step(self) -> None:
        inputs, labels = next(self.data)
        with torch.no_grad():
            teacher_logits = self.teacher(inputs)
        logits = self.student(inputs)
        t = self.temperature
        loss_kd = F.kl_div(
            F.log_softmax(logits / t, dim=1),
            F.log_softmax(teacher_logits / t, dim=1),
            reduction="batchmean",
            log_target=True,
        ) * t * t
        loss_ce = F.cross_entropy(logits, labels)
        loss = self.alpha * loss_kd + (1 - self.alpha) * loss_ce
        self.update.apply(loss, self.after_backward)
        losses = (("total_loss", loss), ("loss_kd", loss_kd), ("loss_ce", loss_ce))
        for name, value in losses:
            self.storage.put_scalar(name, value.detach(), kind=ScalarKind.LOSS)


def mlp(hidden: int, dropout: float = 0.0) -> nn.Module:
    """A two-layer network of ``hidden`` units (the teacher wide, the student narrow, with dropout)."""
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 4))


def train(args: argparse.Namespace) -> None:
    """Builds the job, seeded the same in every run, and trains it."""
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    seed_all_rng(SEED)
    # The teacher labels the data: a stand-in for a network trained before.
    teacher = mlp(64).eval().requires_grad_(False)
    inputs = torch.randn(64, 8)
    labels = teacher(inputs).argmax(dim=1)
    loader = DataLoader(TensorDataset(inputs, labels), batch_size=8, shuffle=True,
                        generator=torch.Generator().manual_seed(SEED))
    student = mlp(16, dropout=0.1)  # dropout draws from torch's generator: the checkpoint keeps its state
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9)
    trainer = TrainerBase(DistillationStep(student, teacher, loader, optimizer))
    checkpointer = Checkpointer(student, args.output_dir, optimizer=optimizer, teacher=teacher, trainer=trainer)
    job.train(trainer, checkpointer, args)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    train(job.parse_args(__doc__, argv))


if __name__ == "__main__":
    main()
