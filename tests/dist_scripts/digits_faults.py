"""The digits example (``configs/digits_mlp.py``) with a fault injected on one rank.

A config for ``tools/train_net.py``, used by ``tests/engine/test_distributed_jobs.py``.
The model is the digits MLP inside a wrapper that, on rank ``model.rank``,
during training (the iteration read from the event storage, so it holds
after a resume), can:

- ``model.nan_from_iter=K``: return NaN logits from iteration K on;
- ``model.raise_at_iter=K``: raise a RuntimeError at iteration K;
- ``model.pause_at_iter=K``: create the file ``model.pause_marker`` and wait
  while it exists (at most 10 minutes): the test kills the job there, or
  signals it and removes the file to let it go on;
- ``model.signal_at_iter=K``: send SIGTERM to its own process at iteration K
  (a scheduler's preemption arriving on that rank then).

Negative values switch a fault off; with all off, training is that of the
digits example (the weights are under ``model.``).
"""

import os
import signal
import time

from torch import nn

from treadle.config import LazyCall as L
from treadle.config import LazyConfig
from treadle.events import get_event_storage, has_event_storage
from treadle.utils import comm

_base = LazyConfig.load(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "configs", "digits_mlp.py"))


class _FaultyModel(nn.Module):
    def __init__(
        self, model, rank=1, nan_from_iter=-1, raise_at_iter=-1, pause_at_iter=-1, pause_marker="", signal_at_iter=-1
    ):
        super().__init__()
        self.signal_at_iter = signal_at_iter
        self.model = model
        self.rank = rank
        self.nan_from_iter = nan_from_iter
        self.raise_at_iter = raise_at_iter
        self.pause_at_iter = pause_at_iter
        self.pause_marker = pause_marker

    def forward(self, x):
        out = self.model(x)
        if not (self.training and has_event_storage() and comm.get_rank() == self.rank):
            return out
        it = get_event_storage().iter
        if it == self.signal_at_iter:
            os.kill(os.getpid(), signal.SIGTERM)
        if it == self.raise_at_iter:
            raise RuntimeError(f"injected failure on rank {self.rank} at iteration {it}")
        if it == self.pause_at_iter:
            with open(self.pause_marker, "w") as f:
                f.write(str(it))
            deadline = time.monotonic() + 600
            while os.path.exists(self.pause_marker) and time.monotonic() < deadline:
                time.sleep(0.02)
        if 0 <= self.nan_from_iter <= it:
            out = out * float("nan")
        return out


model = L(_FaultyModel)(
    model=_base.model, rank=1, nan_from_iter=-1, raise_at_iter=-1, pause_at_iter=-1, pause_marker="", signal_at_iter=-1
)
optimizer = _base.optimizer
lr_multiplier = _base.lr_multiplier
dataloader = _base.dataloader
train = _base.train
