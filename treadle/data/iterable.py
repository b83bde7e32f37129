"""Iterable datasets cut into per-rank, per-worker batches of one global stream.

An iterable has no random access, so its global stream (the items in the
order it yields them, cycled forever for training) is read in full by every
rank and every data worker, each keeping its own share. This keeps the
positions of items, and hence resume and per-sample seeding, identical to the
map-style case, at the price of each reader touching every item: put heavy
work where only kept items pay for it, or use a map-style dataset.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, List, Optional

from torch.utils.data import IterableDataset, get_worker_info

from .seeding import cycle_seed, preserve_cpu_rngs, sample_seed, seed_cpu_rngs

__all__ = ["ShardedIterable"]


class _EndOfStream(Exception):
    """Raised by a reader of a finite stream past its last item."""


class _StreamReader:
    """Reads one global stream of ``source`` item by item, knowing each item's position."""

    def __init__(self, source: Iterable[Any], *, cycle: bool, seed: Optional[int]) -> None:
        self._source = source
        self._cycle = cycle
        self._seed = seed
        self._iterator: Optional[Iterator[Any]] = None
        self._cycles_started = 0
        self._items_this_cycle = 0
        self.next_position = 0

    def _start_cycle(self) -> bool:
        if self._cycles_started > 0 and not self._cycle:
            return False
        if self._seed is not None:
            # Whatever the source draws when it (re)starts is fixed too.
            seed_cpu_rngs(cycle_seed(self._seed, self._cycles_started))
        self._iterator = iter(self._source)
        self._cycles_started += 1
        self._items_this_cycle = 0
        return True

    def read(self) -> Any:
        """The item at ``next_position``; raises ``_EndOfStream`` past a finite stream's end."""
        while True:
            if self._iterator is None and not self._start_cycle():
                raise _EndOfStream
            if self._seed is not None:
                # Seeding before every item, kept or skipped, makes the whole
                # stream a function of positions only, even for sources whose
                # state carries from item to item (e.g. a shuffle buffer).
                seed_cpu_rngs(sample_seed(self._seed, self.next_position))
            assert self._iterator is not None  # _start_cycle made one
            try:
                item = next(self._iterator)
            except StopIteration:
                self._iterator = None
                if self._cycle and self._items_this_cycle == 0:
                    raise ValueError(
                        f"dataset {type(self._source).__name__} yielded no items when iterated"
                        + (" again" if self._cycles_started > 1 else "")
                        + ": the train loader cycles its dataset forever, which needs a"
                        " non-empty re-iterable (a list, an IterableDataset), not an empty"
                        " one or an exhausted one-shot iterator/generator"
                    ) from None
                continue
            self._items_this_cycle += 1
            self.next_position += 1
            return item


class ShardedIterable(IterableDataset):
    """Yields this rank's (and this data worker's) batches, as lists, of a global item stream.

    Rank ``r`` of ``W`` with ``batch_size`` ``b`` gets as its ``j``-th batch the
    items at global positions ``start + r + W * (j * b + i)`` for ``i < b``:
    the same layout as :class:`~treadle.data.TrainingSampler`. Data worker
    ``w`` of ``N`` builds the batches ``j = w, w + N, ...``, which is the order
    in which ``torch.utils.data.DataLoader`` takes them from its workers, so
    the batches are the same for any number of workers.

    The items before ``start`` are read and discarded (O(start)). With
    ``cycle`` the source is iterated again whenever it ends; without it the
    last batch may be short and iteration stops. With a ``seed``, the CPU
    generators are seeded before each item is read (see
    :func:`~treadle.data.seeding.sample_seed`), and, in the main process,
    restored after each batch.

    The source must yield the same stream in every worker: it must not shard
    itself with ``torch.utils.data.get_worker_info()``; this class does.
    """

    def __init__(
        self,
        source: Iterable[Any],
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        start: int = 0,
        cycle: bool,
        seed: Optional[int],
    ) -> None:
        self.source = source
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.cycle = cycle
        self.seed = seed

    def __iter__(self) -> Iterator[List[Any]]:
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        in_main = info is None
        reader = _StreamReader(self.source, cycle=self.cycle, seed=self.seed)
        b, step = self.batch_size, self.world_size
        batch_index = worker_id
        while True:
            first = self.start + self.rank + step * batch_index * b
            batch = []
            scope = (
                preserve_cpu_rngs()
                if in_main and self.seed is not None
                else contextlib.nullcontext()
            )
            with scope:
                try:
                    for position in range(first, first + step * b, step):
                        while reader.next_position < position:
                            reader.read()
                        batch.append(reader.read())
                except _EndOfStream:
                    pass
            if batch:
                yield batch
            if len(batch) < b:
                return
            batch_index += num_workers
