"""Index samplers: an infinite, resumable training stream and an exact-cover inference split."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Tuple, cast

import numpy as np
from torch.utils.data import Sampler

from ._checks import check_int, resolve_rank_and_world
from .seeding import resolve_seed

__all__ = ["TrainingSampler", "InferenceSampler"]

_BLOCK = 8192


class TrainingSampler(Sampler[int]):
    """An infinite stream of dataset indices, sharded over ranks, that can start anywhere.

    The global stream is the concatenation of one permutation of
    ``range(size)`` per epoch (``range(size)`` itself when ``shuffle=False``).
    Epoch ``e``'s permutation is drawn from a generator seeded by
    ``(seed, e)`` alone, so any epoch is produced without the ones before it.
    Rank ``r`` of ``W`` takes the global positions ``start + r``,
    ``start + r + W``, ``start + r + 2W``, ... Hence a batch of ``b`` indices
    per rank is, over all ranks, exactly the ``b * W`` consecutive positions of
    the global stream, whatever ``W`` is.

    Starting at a global position costs one permutation (of the epoch that
    position falls in), never a walk over the skipped positions.

    Args:
        size: number of samples in the dataset (> 0).
        shuffle: permute each epoch; otherwise every epoch is ``0..size-1``.
        seed: non-negative seed of the permutations; ``None`` draws one shared
            by all ranks (see :func:`treadle.utils.comm.shared_random_seed`).
        rank, world_size: this process's shard; default from ``treadle.utils.comm``.
        start: global stream position of the first index (over all ranks).
    """

    def __init__(
        self,
        size: int,
        shuffle: bool = True,
        seed: Optional[int] = 0,
        *,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        start: int = 0,
    ) -> None:
        self.size = check_int("TrainingSampler size", size, minimum=1)
        self.shuffle = bool(shuffle)
        self.seed = resolve_seed(seed)
        self.rank, self.world_size = resolve_rank_and_world(rank, world_size)
        self.start = check_int("start", start, minimum=0)

    def set_start(self, position: int) -> None:
        """Makes the next ``iter()`` begin at global stream ``position``.

        An iteration already running keeps its own start.
        """
        self.start = check_int("start", position, minimum=0)

    def epoch_indices(self, epoch: int) -> Sequence[int]:
        """The whole (unsharded) index order of ``epoch``, as a numpy array or range."""
        if not self.shuffle:
            return range(self.size)
        # A sequence of ints seeds numpy's SeedSequence: no two (seed, epoch)
        # pairs share a generator, and epoch 10**9 costs what epoch 0 does.
        return cast(Sequence[int], np.random.default_rng([self.seed, epoch]).permutation(self.size))

    def iter_with_positions(self) -> Iterator[Tuple[int, int]]:
        """Yields ``(global stream position, dataset index)`` for this rank, forever."""
        step = self.world_size
        position = self.start + self.rank
        while True:
            epoch, offset = divmod(position, self.size)
            chunk = self.epoch_indices(epoch)[offset::step]
            # Converted to Python ints in blocks: one numpy call per block keeps
            # the per-index loop cheap without a list of a whole huge epoch.
            for block_start in range(0, len(chunk), _BLOCK):
                block = chunk[block_start : block_start + _BLOCK]
                for index in block.tolist() if isinstance(block, np.ndarray) else block:
                    yield position, index
                    position += step

    def __iter__(self) -> Iterator[int]:
        for _, index in self.iter_with_positions():
            yield index


class InferenceSampler(Sampler[int]):
    """Splits ``range(size)`` into contiguous per-rank shards: every index exactly once.

    There is no padding and no duplicate, so results gathered from all ranks
    are exactly the dataset. The first ``size % world_size`` ranks hold one
    index more than the others.
    """

    def __init__(
        self, size: int, *, rank: Optional[int] = None, world_size: Optional[int] = None
    ) -> None:
        self.size = check_int("InferenceSampler size", size, minimum=0)
        self.rank, self.world_size = resolve_rank_and_world(rank, world_size)
        base, extra = divmod(self.size, self.world_size)
        self.begin = self.rank * base + min(self.rank, extra)
        self.end = self.begin + base + (1 if self.rank < extra else 0)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.begin, self.end))

    def __len__(self) -> int:
        return self.end - self.begin
