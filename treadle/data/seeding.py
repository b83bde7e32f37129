"""Seeds derived from integers, and per-sample re-seeding of the CPU random generators.

A data pipeline is reproducible when the randomness a sample sees depends only
on the run's seed and the sample's position in the global stream, not on which
process or worker loads it. The functions here give such seeds cheaply (pure
integer hashing, no generator objects) and apply them to python's ``random``,
numpy's global generator and torch's CPU generator.
"""

from __future__ import annotations

import contextlib
import logging
import random
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from treadle.utils import comm

from ._checks import check_int
from ._worker_signals import ignore_foreign_sigterm

__all__ = [
    "derive_seed",
    "sample_seed",
    "worker_seed",
    "loader_seed",
    "cycle_seed",
    "seed_cpu_rngs",
    "preserve_cpu_rngs",
    "resolve_seed",
    "WorkerSeeder",
]

logger = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
_MASK32 = (1 << 32) - 1

# Domain tags keep seeds made for different purposes from ever coinciding,
# e.g. the seed of sample 3 and the seed of worker 3.
_SAMPLE = 1
_WORKER = 2
_LOADER = 3
_CYCLE = 4


def _mix64(x: int) -> int:
    # splitmix64's finalizer: every input bit affects every output bit.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*values: int) -> int:
    """A 64-bit seed that depends on every value (non-negative ints of any size) and their order."""
    h = 0x243F6A8885A308D3
    for value in values:
        if value < 0:
            raise ValueError(f"derive_seed takes non-negative ints, got {value}")
        # Values above 64 bits are folded in 64-bit chunks so that none collide.
        while True:
            h = _mix64(h ^ _mix64(value & _MASK64))
            value >>= 64
            if not value:
                break
    return h


def sample_seed(seed: int, position: int) -> int:
    """The seed of the sample at ``position`` of the global stream of a run seeded with ``seed``."""
    return derive_seed(seed, _SAMPLE, position)


def worker_seed(seed: int, rank: int, start: int, worker_id: int) -> int:
    """The seed of data worker ``worker_id`` of ``rank`` for a stream started at ``start``."""
    return derive_seed(seed, _WORKER, rank, start, worker_id)


def loader_seed(seed: int, rank: int, start: int) -> int:
    """Seed of the generator handed to ``torch.utils.data.DataLoader`` (see ``build``)."""
    return derive_seed(seed, _LOADER, rank, start)


def cycle_seed(seed: int, cycle: int) -> int:
    """Seed set before an iterable dataset is iterated for the ``cycle``-th time."""
    return derive_seed(seed, _CYCLE, cycle)


def seed_cpu_rngs(seed: int) -> None:
    """Seeds python's ``random``, numpy's global generator and torch's CPU generator.

    CUDA generators are left alone on purpose: in the main process they drive
    the model's dropout, and data pipelines do not draw from them.
    numpy's legacy seed is 32 bits wide, so it gets a 32-bit fold of ``seed``.
    """
    random.seed(seed)
    np.random.seed((seed ^ (seed >> 32)) & _MASK32)
    torch.default_generator.manual_seed(seed & _MASK64)


@contextlib.contextmanager
def preserve_cpu_rngs() -> Iterator[None]:
    """Restores python's, numpy's and torch's CPU generator states on exit.

    Used around per-sample re-seeding in the main process, whose generators
    belong to the training loop (initialization, dropout) and must not move.
    """
    py_state = random.getstate()
    np_state = np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def resolve_seed(seed: Optional[int]) -> int:
    """Checks ``seed``; ``None`` draws one on rank 0 and shares it with every rank."""
    if seed is None:
        seed = comm.shared_random_seed()
        logger.info("Data loading uses the generated seed %d", seed)
        return seed
    return check_int("seed", seed, minimum=0)


class WorkerSeeder:
    """``worker_init_fn`` that seeds each data worker from (seed, rank, start, worker id).

    It also makes the worker ignore a SIGTERM that does not come from the
    main process (see ``treadle.data._worker_signals.ignore_foreign_sigterm``),
    so that a scheduler signalling every process of a job does not kill the
    workers under a main process that is saving its preemption checkpoint.

    A class rather than a closure so that it pickles for the ``spawn`` and
    ``forkserver`` start methods. ``then`` is the user's own ``worker_init_fn``,
    run after seeding.
    """

    def __init__(
        self, seed: int, rank: int, start: int, then: Optional[Callable[[int], None]] = None
    ) -> None:
        self.seed = seed
        self.rank = rank
        self.start = start
        self.then = then

    def __call__(self, worker_id: int) -> None:
        ignore_foreign_sigterm()
        seed_cpu_rngs(worker_seed(self.seed, self.rank, self.start, worker_id))
        if self.then is not None:
            self.then(worker_id)
