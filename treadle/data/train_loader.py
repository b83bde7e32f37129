"""The endless, resumable training loader."""

from __future__ import annotations

import collections.abc
import logging
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

from torch.utils.data import DataLoader

from ._checks import check_int, is_map_style, resolve_rank_and_world
from ._dataloader import WorkerOptions, make_dataloader
from .iterable import ShardedIterable
from .per_sample import SeededMapDataset, StreamBatchSampler
from .samplers import TrainingSampler
from .seeding import resolve_seed

__all__ = ["TrainLoader"]

logger = logging.getLogger(__name__)

_STATE_KEYS = ("position", "seed", "total_batch_size", "shuffle", "dataset_size")


class TrainLoader:
    """An endless iterable of this rank's training batches that checkpoints its position.

    Contract:

    - Over all ranks, step ``k`` (the ``k``-th batch taken, from 0) holds
      exactly the global stream positions ``[P + k*T, P + (k+1)*T)``, where
      ``T = total_batch_size`` and ``P`` is the position the iteration started
      at; each rank holds ``T / world_size`` of them (see
      :class:`TrainingSampler` for the global stream of a map-style dataset;
      an iterable dataset's stream is its items, cycled forever).
    - :attr:`position` counts the samples, over all ranks, of the batches the
      consumer has taken (not those workers have prefetched): after ``k``
      batches from a fresh loader it is ``k * T``. :meth:`state_dict` records
      it; :meth:`load_state_dict` makes the next iteration start there.
    - The position is read when an iteration's first batch is requested, so
      ``it = iter(loader)``, then ``loader.load_state_dict(...)``, then
      ``next(it)`` resumes correctly. One iteration is live at a time: starting
      another, or loading a state, makes the older one raise if advanced.
    - With ``per_sample_seed``, a sample's randomness depends only on
      ``(seed, its global position)``: batches are identical for any
      ``num_workers`` and world size, and after a resume. By default
      (``None``) it is on when worker processes load the data (where it
      costs the training process nothing) and off with ``num_workers=0``,
      where the dataset draws from the training process's generators, whose
      state checkpoints restore: resume is exact either way.

    Build it with :func:`treadle.data.build_train_loader`, which documents the
    arguments.
    """

    def __init__(
        self,
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
    ) -> None:
        self.dataset = dataset
        self._map_style = is_map_style(dataset)
        self.rank, self.world_size = resolve_rank_and_world(rank, world_size)
        self.total_batch_size = check_int("total_batch_size", total_batch_size, minimum=1)
        self.batch_size = _rank_batch_size(total_batch_size, self.world_size, drop_last)
        self.shuffle = _shuffles(dataset, self._map_style, shuffle)
        self._options = WorkerOptions(
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            worker_init_fn=worker_init_fn,
            prefetch_factor=prefetch_factor,
            timeout=timeout,
            multiprocessing_context=multiprocessing_context,
        )
        self._seed_given = seed is not None
        self.seed = resolve_seed(seed)
        self.per_sample_seed = num_workers > 0 if per_sample_seed is None else bool(per_sample_seed)
        # A one-shot iterator cannot restart, so a second iteration would
        # silently continue wherever the first one left it.
        self._one_shot = isinstance(dataset, collections.abc.Iterator)
        self._started = 0  # iterations that took a first batch
        self._iterations = 0  # bumped by each start and each load: older iterations are stale
        self._position = 0
        # Builds (and drops) the torch loader once so that bad options fail here, not at step 1.
        self._torch_loader(0)

    @property
    def epoch_length(self) -> Optional[int]:
        """Iterations per epoch, ``len(dataset) // total_batch_size``; None for an iterable."""
        if not self._map_style:
            return None
        return len(self.dataset) // self.total_batch_size

    @property
    def num_workers(self) -> int:
        return self._options.num_workers

    @property
    def position(self) -> int:
        """Samples, over all ranks, in the batches taken so far (plus the loaded start)."""
        return self._position

    def state_dict(self) -> Dict[str, int]:
        """The data position and what it depends on, as plain Python ints."""
        state = {
            "position": self._position,
            "seed": self.seed,
            "total_batch_size": self.total_batch_size,
            "shuffle": int(self.shuffle),
        }
        if self._map_style:
            state["dataset_size"] = len(self.dataset)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next iteration start at ``state["position"]``.

        A different seed is adopted from ``state`` (resume continues the saved
        stream), with a warning when this loader was given an explicit seed. A
        different total batch size, shuffle flag or dataset size is warned
        about: the position is in samples, so no sample is repeated or skipped,
        but the batches are no longer those of the original run.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"TrainLoader state must be a mapping, got {type(state).__name__}")
        unknown = sorted(set(state) - set(_STATE_KEYS))
        if unknown:
            raise ValueError(
                f"unknown keys {unknown} in TrainLoader state; known keys: {list(_STATE_KEYS)}"
            )
        if "position" not in state:
            raise ValueError(f"TrainLoader state has no 'position' (keys: {sorted(state)})")
        position = check_int("TrainLoader state 'position'", state["position"], minimum=0)
        saved_seed = state.get("seed", self.seed)
        check_int("TrainLoader state 'seed'", saved_seed, minimum=0)
        if saved_seed != self.seed:
            log = logger.warning if self._seed_given else logger.info
            log(
                "Data loader state was saved with seed=%d, but this loader has seed=%d; "
                "continuing the saved stream with seed=%d",
                saved_seed,
                self.seed,
                saved_seed,
            )
            self.seed = saved_seed
        now = self.state_dict()
        for key in ("total_batch_size", "shuffle", "dataset_size"):
            if key in state and state[key] != now.get(key):
                logger.warning(
                    "Data loader state was saved with %s=%s, but this loader has %s=%s; "
                    "resuming at sample %d of the global stream, but the batches from "
                    "here on differ from those of the original run",
                    key,
                    state[key],
                    key,
                    now.get(key),
                    position,
                )
        if not self._map_style and position > 0:
            logger.info(
                "Resuming an iterable dataset at sample %d: every data worker reads and "
                "discards the %d samples before it (O(n); a map-style dataset resumes in O(1))",
                position,
                position,
            )
        self._position = position
        self._iterations += 1  # makes a running iteration stale

    def _torch_loader(self, start: int) -> DataLoader:
        seed = self.seed
        if self._map_style:
            sampler = TrainingSampler(
                len(self.dataset),
                self.shuffle,
                seed,
                rank=self.rank,
                world_size=self.world_size,
                start=start,
            )
            batches = StreamBatchSampler(
                sampler, self.batch_size, sample_seeds=self.per_sample_seed
            )
            dataset = SeededMapDataset(self.dataset, seed) if self.per_sample_seed else self.dataset
            return make_dataloader(
                dataset,
                self._options,
                seed=seed,
                rank=self.rank,
                start=start,
                batch_sampler=batches,
            )
        stream = ShardedIterable(
            self.dataset,
            batch_size=self.batch_size,
            rank=self.rank,
            world_size=self.world_size,
            start=start,
            cycle=True,
            seed=seed if self.per_sample_seed else None,
        )
        return make_dataloader(
            stream, self._options, seed=seed, rank=self.rank, start=start, batch_size=None
        )

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing below runs, and no worker starts, until the
        # first batch is requested.
        if self._one_shot and self._started > 0:
            raise RuntimeError(
                f"the train dataset ({type(self.dataset).__name__}) is a one-shot iterator "
                "and this loader was already iterated; it cannot restart. Pass a "
                "re-iterable (a list, an IterableDataset) or build a new loader"
            )
        self._started += 1
        self._iterations += 1
        iteration = self._iterations
        batches = iter(self._torch_loader(self._position))
        while True:
            if self._iterations != iteration:
                raise RuntimeError(
                    "this iteration of the TrainLoader is stale: a newer iter() or "
                    "load_state_dict() has happened since it started; take a new iter(loader)"
                )
            batch = next(batches)
            self._position += self.total_batch_size
            yield batch


def _rank_batch_size(total_batch_size: int, world_size: int, drop_last: bool) -> int:
    """Each rank's share of the global batch; refuses a total the ranks cannot
    share evenly, and ``drop_last=False`` (the endless stream has no last batch)."""
    if total_batch_size % world_size:
        raise ValueError(
            f"total_batch_size={total_batch_size} is not divisible by the world size "
            f"{world_size}: each rank takes total_batch_size / world_size samples, "
            f"so use a multiple of {world_size}"
        )
    if not drop_last:
        raise ValueError(
            "drop_last=False is not supported by the train loader: its stream is endless "
            "and crosses epoch boundaries, so every batch is full and no sample is dropped"
        )
    return total_batch_size // world_size


def _shuffles(dataset: Any, map_style: bool, shuffle: Optional[bool]) -> bool:
    """Whether the stream is shuffled: a map-style dataset's is by default
    (an empty one is refused); an iterable dataset's never is (refused if asked)."""
    if map_style:
        if len(dataset) == 0:
            raise ValueError(f"the train dataset ({type(dataset).__name__}) is empty")
        return True if shuffle is None else bool(shuffle)
    if shuffle:
        raise ValueError(
            f"shuffle=True needs random access, but the dataset "
            f"({type(dataset).__name__}) is iterable: it is read in the order it "
            "yields; shuffle inside it, or pass shuffle=None"
        )
    return False
