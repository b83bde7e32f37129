"""What the hook tests share: a tiny resumable job, scripted evaluations, crash and stop hooks."""

import itertools
import json
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

from treadle.checkpoint import Checkpointer
from treadle.data import build_train_loader
from treadle.engine import EagerStep, TrainerBase
from treadle.hooks import (
    CallbackHook,
)


class Run:
    """A tiny job: a linear model, a resumable loader of 16 samples (4 iterations per epoch).

    Each of ``hooks`` is a function of the Run returning a hook (so that it
    can use the Run's checkpointer and trainer); they are registered in order.
    """

    def __init__(self, out, *hooks):
        torch.manual_seed(0)
        self.model = nn.Linear(3, 1)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))
        self.loader = build_train_loader(data, total_batch_size=4, seed=0)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.trainer = TrainerBase(EagerStep(self.model, self.loader, self.optimizer, loss_fn=nn.functional.mse_loss))
        self.trainer.epoch_length = self.loader.epoch_length
        self.checkpointer = Checkpointer(self.model, str(out), optimizer=self.optimizer, trainer=self.trainer)
        self.out = out
        # Weights after each iteration, taken before any checkpointing hook runs.
        self.weights = {}
        snapshot = CallbackHook(after_step=self._snapshot, after_train=self._snapshot_final)
        self.trainer.register_hooks([snapshot] + [make(self) for make in hooks])

    def _snapshot(self, trainer):
        self.weights[trainer.iter] = {k: v.clone() for k, v in self.model.state_dict().items()}

    def _snapshot_final(self, trainer):
        self.weights["final"] = {k: v.clone() for k, v in self.model.state_dict().items()}

    def load(self, name):
        return torch.load(self.out / name, weights_only=True)

    def files(self):
        return sorted(os.listdir(self.out)) if self.out.exists() else []

    def pointer(self):
        return (self.out / "last_checkpoint").read_text()

    def resume(self):
        extra = self.checkpointer.resume_or_load("", resume=True)
        return int(extra["iteration"]) + 1


make_run = Run


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def scripted_eval(trainer_ref, script, calls, name="acc"):
    """An eval function returning ``script[iteration]`` as ``name``; records when it ran."""

    def evaluate():
        it = trainer_ref().iter
        calls.append(it)
        return {name: script[it]}

    return evaluate


def crash_at(iteration):
    def maybe_raise(trainer):
        if trainer.iter == iteration:
            raise RuntimeError(f"crash at {iteration}")

    return CallbackHook(after_step=maybe_raise)


def stop_at(iteration):
    return CallbackHook(after_step=lambda t: t.request_stop("enough") if t.iter == iteration else None)


def make_trainer(model=None, lr=0.1):
    torch.manual_seed(0)
    model = model or nn.Linear(3, 1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return TrainerBase(EagerStep(model, itertools.cycle(data), opt, loss_fn=nn.functional.mse_loss)), model


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]
