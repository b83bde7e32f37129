"""A plain ``Trainer`` job as its user writes it, preempted by a SIGTERM at a
chosen iteration (``python tests/trainer/preemption_job.py OUT ITER``; under
``torchrun``, ``... OUT ITER agent``: rank 0 signals torchrun's agent);
``tests/trainer/test_preemption.py`` runs it and resumes it."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from treadle.trainer import Trainer
from treadle.hooks import CallbackHook, HookBase

# Checkpoints after iterations 3 and 7; metrics.json rows after 2, 5, 8, 11 and before each checkpoint.
MAX_ITER, CHECKPOINT_PERIOD, LOG_PERIOD = 12, 4, 3


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 6, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)  # 4 batches an epoch


def trainer(output_dir: str, hooks: Sequence[HookBase] = (), **options: Any) -> Trainer:
    m = model()
    return Trainer(m, torch.optim.SGD(m.parameters(), lr=0.1), data(), loss_fn=nn.functional.cross_entropy,
                   max_iter=MAX_ITER, checkpoint_period=CHECKPOINT_PERIOD, log_period=LOG_PERIOD,
                   output_dir=output_dir, hooks=list(hooks), loggers=["json"], progress_bar=False, **options)


def sigterm_at(iteration: int) -> CallbackHook:
    """A real SIGTERM to this process while ``iteration`` runs, as a scheduler sends it."""
    return CallbackHook(after_step=lambda t: t.iter == iteration and os.kill(os.getpid(), signal.SIGTERM))


def sigterm_to_the_agent_at(iteration: int) -> CallbackHook:
    """Under torchrun: a SIGTERM to torchrun (this process's parent) while
    ``iteration`` runs, which it passes on to every worker; this one then
    waits (the others wait for it) so that the signal reaches them before
    the run's end, as a scheduler's comes long before it."""
    def signal_the_agent(trainer: Any) -> None:
        if trainer.iter == iteration:
            os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(3)  # resumed after the handler runs (PEP 475)
    return CallbackHook(after_step=signal_the_agent)


if __name__ == "__main__":
    if sys.argv[3:] == ["agent"]:  # under torchrun: rank 0 signals torchrun
        trainer(sys.argv[1], [sigterm_to_the_agent_at(int(sys.argv[2]))] if os.environ["RANK"] == "0" else []).train()
    else:
        trainer(sys.argv[1], [sigterm_at(int(sys.argv[2]))]).train()
