"""Builders of the train and test loaders, the entry points configs call."""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch.utils.data import BatchSampler, DataLoader

from ._checks import check_int, is_map_style, resolve_rank_and_world
from ._dataloader import WorkerOptions, make_dataloader
from .iterable import ShardedIterable
from .samplers import InferenceSampler
from .train_loader import TrainLoader

__all__ = ["build_train_loader", "build_test_loader"]


def build_train_loader(
    dataset: Any,
    *,
    total_batch_size: int,
    num_workers: int = 0,
    collate_fn: Optional[Callable[[list], Any]] = None,
    seed: Optional[int] = 0,
    shuffle: Optional[bool] = None,
    drop_last: bool = True,
    pin_memory: bool = False,
    per_sample_seed: Optional[bool] = None,
    worker_init_fn: Optional[Callable[[int], None]] = None,
    prefetch_factor: Optional[int] = None,
    timeout: float = 0,
    multiprocessing_context: Any = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
) -> TrainLoader:
    """An endless, resumable loader of this rank's training batches.

    Args:
        dataset: map-style (``__len__`` and ``__getitem__``), sampled through
            a :class:`TrainingSampler`; or iterable (``torch.utils.data.IterableDataset``
            or any re-iterable), cycled forever and read in its own order.
        total_batch_size: samples per step over all ranks; must be divisible
            by the world size. Each rank's batches hold ``total_batch_size / world_size``.
        num_workers: data worker processes per rank (0: load in this process).
        collate_fn: turns a list of samples into a batch; default
            ``torch.utils.data.default_collate``.
        seed: seed of the sample order and of the per-sample seeds; ``None``
            draws one shared by all ranks (recorded in ``state_dict``).
        shuffle: permute each epoch of a map-style dataset (the default for
            one); must be unset or False for an iterable dataset.
        drop_last: must be True: batches are always full (the stream crosses
            epochs), accepted for symmetry with ``DataLoader``.
        pin_memory: passed to ``DataLoader``.
        per_sample_seed: seed python, numpy and torch's CPU generator with
            ``(seed, global sample position)`` before each sample is fetched,
            so that random augmentation does not depend on ``num_workers`` or
            on resuming. Costs about 10-20 microseconds per sample (plus, with
            ``num_workers=0``, saving and restoring the generators once per
            batch). ``None`` (default): on when ``num_workers > 0`` (the cost
            is in the workers), off otherwise (the dataset then draws from the
            training process's generators, which checkpoints restore, so
            resume stays exact, but batches differ from a run with workers).
        worker_init_fn: run in each worker after treadle seeds it from
            ``(seed, rank, start position, worker id)``.
        prefetch_factor, timeout, multiprocessing_context: passed to
            ``DataLoader``; only with ``num_workers > 0``.
        rank, world_size: this process's shard; default from ``treadle.utils.comm``.
    """
    return TrainLoader(
        dataset,
        total_batch_size=total_batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn,
        seed=seed,
        shuffle=shuffle,
        drop_last=drop_last,
        pin_memory=pin_memory,
        per_sample_seed=per_sample_seed,
        worker_init_fn=worker_init_fn,
        prefetch_factor=prefetch_factor,
        timeout=timeout,
        multiprocessing_context=multiprocessing_context,
        rank=rank,
        world_size=world_size,
    )


def build_test_loader(
    dataset: Any,
    *,
    batch_size: int = 1,
    num_workers: int = 0,
    collate_fn: Optional[Callable[[list], Any]] = None,
    seed: int = 0,
    pin_memory: bool = False,
    worker_init_fn: Optional[Callable[[int], None]] = None,
    prefetch_factor: Optional[int] = None,
    timeout: float = 0,
    multiprocessing_context: Any = None,
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
) -> DataLoader:
    """A finite loader that gives each sample to exactly one rank, once.

    A map-style dataset is split into contiguous shards by
    :class:`InferenceSampler`; an iterable one is read in full by each rank,
    which keeps the items at positions ``rank, rank + W, ...``. The last batch
    of a rank may be short. ``batch_size`` is per rank. ``seed`` seeds the
    workers (from ``(seed, rank, worker id)``), so test-time randomness is
    repeatable; iterating never draws from the global random generators.
    """
    check_int("batch_size", batch_size, minimum=1)
    rank, world_size = resolve_rank_and_world(rank, world_size)
    check_int("seed", seed, minimum=0)
    options = WorkerOptions(
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        worker_init_fn=worker_init_fn,
        prefetch_factor=prefetch_factor,
        timeout=timeout,
        multiprocessing_context=multiprocessing_context,
    )
    if is_map_style(dataset):
        sampler = InferenceSampler(len(dataset), rank=rank, world_size=world_size)
        batches = BatchSampler(sampler, batch_size, drop_last=False)
        return make_dataloader(
            dataset, options, seed=seed, rank=rank, start=0, batch_sampler=batches
        )
    stream = ShardedIterable(
        dataset,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        cycle=False,
        seed=None,
    )
    return make_dataloader(stream, options, seed=seed, rank=rank, start=0, batch_size=None)
