"""MoCo: contrastive learning against a queue of keys, on one or several processes.

A query encoder (trained, under DDP on several processes) and a key
encoder (its momentum average, never trained) embed two noisy views of each
sample; the query of a sample must match its own key against the ``K``
keys of earlier batches, kept in a queue (He et al., 2020). The queue and
its pointer are the step's own state: ``state_dict()`` adds them to what
:class:`~treadle.engine.StepBase` saves (the data position). Each rank
enqueues its own keys, so each rank's queue is its own. The key encoder is
saved under ``key``::

    python -m treadle.examples.research.moco --output-dir D --max-iter 40 [--num-gpus 2] [--resume]
"""

from __future__ import annotations

import argparse
import copy
from typing import Any, Dict, Iterable, List, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from treadle.checkpoint import Checkpointer, unwrap_model
from treadle.data import DataStream
from treadle.engine import StepBase, TrainerBase, Update, create_ddp_model, launch
from treadle.events import ScalarKind
from treadle.examples.research import job
from treadle.utils import comm
from treadle.utils.env import seed_all_rng
from treadle.utils.torch_internals import foreach_lerp_

__all__ = ["MoCoStep", "train", "main"]

SEED = 0


class MoCoStep(StepBase):
    """One query-encoder update on the InfoNCE loss of each query against its
    key and the queue; then the batch's keys replace the queue's oldest
    (``queue_size`` a multiple of the batch size)."""

    def __init__(
        self,
        query: nn.Module,
        key: nn.Module,
        loader: Iterable,
        optimizer: torch.optim.Optimizer,
        *,
        dim: int,
        queue_size: int = 32,
        momentum: float = 0.9,
        temperature: float = 0.2,
        noise: float = 0.2,
    ) -> None:
        self.query, self.key = query, key.requires_grad_(False)
        self.data = DataStream(loader)
        self.update = Update(optimizer, model=query)
        self.momentum, self.temperature, self.noise = momentum, temperature, noise
        self.key_params = list(key.parameters())
        self.query_params = list(unwrap_model(query).parameters())
        # this rank's generator: its own queue
        self.queue = F.normalize(torch.randn(queue_size, dim), dim=1)
        self.pointer = 0

    def run_step(self) -> None:
        (inputs,) = next(self.data)
        noisy = inputs + self.noise * torch.randn_like(inputs)
        q = F.normalize(self.query(noisy), dim=1)
        with torch.no_grad():
            foreach_lerp_(self.key_params, self.query_params, 1 - self.momentum)
            noisy = inputs + self.noise * torch.randn_like(inputs)
            k = F.normalize(self.key(noisy), dim=1)
        logits = torch.cat([(q * k).sum(dim=1, keepdim=True), q @ self.queue.T], dim=1)
        logits = logits / self.temperature
        # the positive is column 0
        loss = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))
        self.update.apply(loss, self.after_backward)
        self.queue[self.pointer:self.pointer + len(k)] = k
        self.pointer = (self.pointer + len(k)) % len(self.queue)
        self.storage.put_scalar("total_loss", loss.detach(), kind=ScalarKind.LOSS)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "queue": self.queue, "pointer": self.pointer}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        self.queue.copy_(state.pop("queue"))
        self.pointer = state.pop("pointer")
        super().load_state_dict(state)


def train(args: argparse.Namespace) -> None:
    """Builds the job on this process (one of ``--num-gpus``) and trains it."""
    torch.set_num_threads(1)  # the same reductions in every run: bit-exact comparisons
    seed_all_rng(SEED)
    dataset = TensorDataset(torch.randn(64, 8))
    sampler: DistributedSampler = DistributedSampler(dataset, comm.get_world_size(), comm.get_rank(), seed=SEED)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, generator=torch.Generator().manual_seed(SEED))
    encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    key = copy.deepcopy(encoder)
    optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1, momentum=0.9)
    seed_all_rng(SEED + comm.get_rank())  # each rank its own noise and queue
    trainer = TrainerBase(MoCoStep(create_ddp_model(encoder), key, loader, optimizer, dim=8))
    checkpointer = Checkpointer(encoder, args.output_dir, optimizer=optimizer, key=key, trainer=trainer)
    job.train(trainer, checkpointer, args)


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the job from the command line's arguments (``argv``: ``sys.argv[1:]`` when None); see the module's docstring."""
    args = job.parse_args(__doc__, argv, processes=True)
    launch(train, args.num_gpus, args=(args,))


if __name__ == "__main__":
    main()
