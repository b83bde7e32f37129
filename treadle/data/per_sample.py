"""Per-sample seeding for map-style datasets: randomness that follows the sample, not the worker.

The batch sampler tags every index with its global stream position; the
dataset wrapper derives the sample's seed from it and seeds the CPU generators
right before fetching that index. The seed is derived in the wrapper, which
runs in the data workers, not in the sampler, which runs in the training
process. A sample's random augmentation is then the same whichever worker loads
it, for any ``num_workers``, and after a resume.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Iterator, List, Sequence, Tuple, Union

from torch.utils.data import Dataset, Sampler, get_worker_info

from .samplers import TrainingSampler
from .seeding import preserve_cpu_rngs, sample_seed, seed_cpu_rngs

__all__ = ["StreamBatchSampler", "SeededMapDataset"]

# (dataset index, global stream position)
PositionedIndex = Tuple[int, int]


class StreamBatchSampler(Sampler[List[Any]]):
    """Cuts a :class:`TrainingSampler`'s stream into batches of ``batch_size`` indices.

    With ``sample_seeds=True`` each item is ``(index, position)``, the item's
    global stream position; pair it with a :class:`SeededMapDataset` of the
    same seed, which seeds the sample with
    :func:`~treadle.data.seeding.sample_seed` of the two.
    Batches are always full: the stream is infinite and crosses epochs.
    """

    def __init__(self, sampler: TrainingSampler, batch_size: int, *, sample_seeds: bool) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.sample_seeds = sample_seeds

    def __iter__(self) -> Iterator[List[Union[int, PositionedIndex]]]:
        batch: List[Union[int, PositionedIndex]] = []
        for position, index in self.sampler.iter_with_positions():
            batch.append((index, position) if self.sample_seeds else index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []


def _rng_scope() -> ContextManager[None]:
    # A worker process owns its generators, so re-seeding them is free of side
    # effects; the main process's generators belong to the training loop.
    if get_worker_info() is None:
        return preserve_cpu_rngs()
    return contextlib.nullcontext()


class SeededMapDataset(Dataset):
    """Wraps a map-style dataset whose keys are ``(index, position)`` pairs.

    Before ``dataset[index]`` runs, python's ``random``, numpy's global
    generator and torch's CPU generator are seeded with
    ``sample_seed(seed, position)``. In the main
    process their previous states are restored afterwards (once per batch).
    The wrapped dataset's own ``__getitems__``, if any, is not used: seeding is
    per sample, so samples are fetched one by one.
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: PositionedIndex) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[PositionedIndex]) -> List[Any]:
        samples = []
        with _rng_scope():
            for index, position in keys:
                seed_cpu_rngs(sample_seed(self.seed, position))
                samples.append(self.dataset[index])
        return samples
