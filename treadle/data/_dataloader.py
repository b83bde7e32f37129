"""Construction of the ``torch.utils.data.DataLoader`` that treadle's loaders run on."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader, default_collate

from ._checks import check_int
from .seeding import WorkerSeeder, loader_seed

__all__ = ["WorkerOptions", "make_dataloader"]


class WorkerOptions:
    """The loading options shared by the train and test loaders, checked once.

    Options that only mean something with worker processes are rejected with
    ``num_workers=0`` rather than ignored.
    """

    def __init__(
        self,
        *,
        num_workers: int,
        collate_fn: Optional[Callable[[list], Any]],
        pin_memory: bool,
        worker_init_fn: Optional[Callable[[int], None]],
        prefetch_factor: Optional[int],
        timeout: float,
        multiprocessing_context: Any,
    ) -> None:
        self.num_workers = check_int("num_workers", num_workers, minimum=0)
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        self.pin_memory = bool(pin_memory)
        if num_workers == 0:
            extra = {
                "worker_init_fn": worker_init_fn,
                "prefetch_factor": prefetch_factor,
                "multiprocessing_context": multiprocessing_context,
            }
            given = sorted(k for k, v in extra.items() if v is not None)
            if timeout:
                given.append("timeout")
            if given:
                raise ValueError(
                    f"{', '.join(given)} only apply to worker processes, but num_workers=0"
                )
        if prefetch_factor is not None:
            check_int("prefetch_factor", prefetch_factor, minimum=1)
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context


def make_dataloader(
    dataset: Any,
    options: WorkerOptions,
    *,
    seed: int,
    rank: int,
    start: int,
    **sampling: Any,
) -> DataLoader:
    """A DataLoader over ``dataset`` (``sampling`` gives its batch_sampler or batch_size=None).

    It gets a generator of its own: DataLoader draws its workers' base seed
    from its generator at every ``iter()``, and from torch's global generator
    when it has none, which would move the training loop's random state.
    """
    generator = torch.Generator()
    generator.manual_seed(loader_seed(seed, rank, start))
    workers: dict = {}
    if options.num_workers > 0:
        workers = {
            "worker_init_fn": WorkerSeeder(seed, rank, start, options.worker_init_fn),
            "prefetch_factor": options.prefetch_factor,
            "timeout": options.timeout,
            "multiprocessing_context": options.multiprocessing_context,
        }
    return DataLoader(
        dataset,
        num_workers=options.num_workers,
        collate_fn=options.collate_fn,
        pin_memory=options.pin_memory,
        generator=generator,
        **workers,
        **sampling,
    )
