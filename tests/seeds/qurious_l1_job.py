"""qurious' ``train_step`` override with an L1 penalty, trained in a process
of its own so that a test can kill it with -9 and resume it
(``tests/compat/test_overrides.py``).

    python tests/seeds/qurious_l1_job.py OUTPUT_DIR MAX_ITER PROGRESS_FILE

Resumes from OUTPUT_DIR's last checkpoint when there is one.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from treadle.trainer import Trainer
from treadle.hooks import HookBase


class L1Trainer(Trainer):
    l1 = 1e-3

    def train_step(self, batch):
        self.model.train()
        inputs, targets = self._prepare_batch(batch)
        self.optimizer.zero_grad()
        outputs = self._forward_pass(inputs)
        loss = self._compute_loss(outputs, targets)
        penalty = self.l1 * sum(p.abs().sum() for p in self.model.parameters())
        loss = loss + penalty
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "l1": penalty.item()}


class Progress(HookBase):
    """Appends each iteration's number to a file, and slows the run so that a kill lands mid-run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def before_step(self) -> None:
        with open(self.path, "a") as f:
            f.write(f"{self.trainer.iter}\n")
        time.sleep(0.01)


def main(output_dir: str, max_iter: int, progress: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    data = TensorDataset(x, (x[:, :3].sum(1) > 0).long())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 2))
    trainer = L1Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), data, batch_size=16,
                        loss_fn=nn.functional.cross_entropy, max_iter=max_iter, checkpoint_period=1,
                        output_dir=output_dir, seed=0, hooks=[Progress(progress)], progress_bar=False,
                        loggers=["json"], log_period=5)
    trainer.train(resume=os.path.exists(os.path.join(output_dir, "last_checkpoint")))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
