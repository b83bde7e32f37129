"""The plain ``Trainer``'s data: what it was given, and the loaders it builds of it.

What the ``Trainer`` is given for ``train_loader`` and ``eval_loader`` is one of:

- a **dataset**: a map-style torch ``Dataset``, or a list (any sequence: an
  object with ``__len__`` and ``__getitem__``) of samples, whatever their
  shapes, as torch's ``DataLoader`` takes it (:mod:`treadle.data.samples`).
  The ``Trainer`` batches it with treadle's resumable, sharded loaders:
  ``batch_size`` per process or ``total_batch_size`` over all processes for
  training; ``eval_batch_size``, else the training batch per process, for
  evaluation. Without a batch size it is refused.
- **batches**: a ``DataLoader``, or any iterable with a length that is not a
  sequence; read as given (``DataLoader(batches, batch_size=None)`` reads a
  list of ready batches). On several processes a ``DataLoader`` over a
  map-style dataset with a plain sampler is re-batched per process, as
  Lightning replaces the sampler; anything else is read whole by every
  process, with a warning.
- a **stream**: batches without a length (a generator, ``iter(batches)``); no epochs then.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional

import torch

from treadle.data import InferenceSampler, TrainLoader, build_test_loader, build_train_loader
from treadle.data.samples import describe_item
from treadle.utils import comm

from treadle.engine.build import loader_batches

__all__ = ["data_kind", "check_batch_sizes", "as_train_loader", "as_eval_loader", "per_process", "run_length",
           "warn_about_leftover_batches"]

logger = logging.getLogger(__name__)


def _is_map_dataset(data: Any) -> bool:
    return isinstance(data, torch.utils.data.Dataset) and not isinstance(data, torch.utils.data.IterableDataset)


def _is_sequence(data: Any) -> bool:
    """A list, or an object Python indexes as one (``__len__`` and ``__getitem__``)."""
    return (
        not isinstance(data, (str, bytes, Mapping, torch.utils.data.DataLoader, torch.utils.data.IterableDataset))
        and hasattr(data, "__len__")
        and hasattr(type(data), "__getitem__")
    )


def _has_length(data: Any) -> bool:
    try:
        return loader_batches(data) is not None
    except TypeError:  # a DataLoader over an iterable dataset
        return False


def data_kind(data: Any, name: str = "train_loader") -> str:
    """``"none"``, ``"dataset"``, ``"batches"`` or ``"stream"`` (the module
    docstring); ``name`` is the argument a ``TypeError`` names."""
    if data is None:
        return "none"
    if isinstance(data, (str, bytes)):  # iterable, so it would pass as samples and fail at the first batch
        raise TypeError(f"{name}={data!r} is a {type(data).__name__}, not data: give a dataset (a torch Dataset, a "
                        "list of samples) or batches (a DataLoader); a file is read into a Dataset first")
    # An object with __getitem__ alone is iterable too (Python's sequence protocol).
    if not (hasattr(data, "__iter__") or hasattr(type(data), "__getitem__")):
        raise TypeError(f"{name} must be an iterable of batches or a dataset, got {type(data).__name__}")
    if _is_map_dataset(data) or _is_sequence(data):
        return "dataset"
    return "batches" if _has_length(data) else "stream"


def _is_empty(data: Any) -> bool:
    """Whether ``data`` has a length, and it is 0 (a dataset of no samples, no batches)."""
    try:
        return loader_batches(data) == 0
    except TypeError:  # a DataLoader over an iterable dataset
        return False


def _what(data: Any) -> str:
    if _is_map_dataset(data):
        return "a dataset"
    return f"a {type(data).__name__} of samples ({describe_item(data[0])} each)"


# Said with every refusal of a dataset without a batch size: the list may be batches already.
_READY_BATCHES = ("; ready-made batches come as a DataLoader (DataLoader(batches, batch_size=None) for a list of them) "
                  "or an iterable that is not a list (a generator)")


def check_batch_sizes(train: Any, evaluation: Any, batch_size: Optional[int], total_batch_size: Optional[int],
                      eval_batch_size: Optional[int]) -> None:
    """Refuses, in one line, data that holds nothing, and a dataset given
    without a batch size for it.

    Raises:
        ValueError: naming the data and the settings that would batch it.
    """
    for name, data in (("train_loader", train), ("eval_loader", evaluation)):
        if data is not None and _is_empty(data):
            instead = "leave eval_loader out to train without evaluation" if name == "eval_loader" else "give it data"
            raise ValueError(f"{name} is empty (a {type(data).__name__} of length 0): {instead}")
    if data_kind(train) == "dataset" and batch_size is None and total_batch_size is None:
        raise ValueError(
            f"train_loader is {_what(train)}: give batch_size=... (per process) or total_batch_size=... (over all "
            "processes) to batch it" + _READY_BATCHES
        )
    if data_kind(evaluation, "eval_loader") == "dataset" and not (eval_batch_size or batch_size or total_batch_size):
        raise ValueError(f"eval_loader is {_what(evaluation)}: give eval_batch_size=... (or batch_size) to batch it"
                         + _READY_BATCHES)


def as_train_loader(data: Any, batch_size: Optional[int], total_batch_size: Optional[int], *, num_workers: int = 0,
                    seed: Optional[int] = None, shuffle: bool = True, collate_fn: Optional[Callable] = None) -> Any:
    """The training loader: a dataset batched by a resumable :class:`TrainLoader`
    (``batch_size`` per process, or ``total_batch_size`` over all of them),
    or the batches given, as this process reads them (:func:`per_process`)."""
    if data_kind(data) != "dataset":
        return per_process(data, train=True, seed=seed)
    world = comm.get_world_size()
    # A total the processes cannot share evenly is refused by the loader, in one line.
    loader = build_train_loader(
        data, total_batch_size=total_batch_size or batch_size * world,  # type: ignore[operator]
        num_workers=num_workers, seed=seed or 0, shuffle=shuffle, collate_fn=collate_fn,
    )
    if total_batch_size is None:
        logger.info("Batches: batch_size=%d per process x %d process(es) = %d samples per step",
                    batch_size, world, loader.total_batch_size)
    else:
        logger.info("Batches: total_batch_size=%d over %d process(es) = %d samples per process",
                    total_batch_size, world, loader.batch_size)
    return loader


def as_eval_loader(data: Any, batch_size: Optional[int], *, num_workers: int = 0,
                   collate_fn: Optional[Callable] = None) -> Optional[Iterable[Any]]:
    """The evaluation loader: a dataset batched by ``batch_size`` (per
    process), each sample read once over the processes; or the batches given."""
    if data is None:
        return None
    if data_kind(data) != "dataset":
        return per_process(data, train=False)
    assert batch_size is not None  # check_batch_sizes refused a dataset without one
    return build_test_loader(data, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_fn)


def per_process(loader: Any, *, train: bool, seed: Optional[int] = None) -> Any:
    """``loader`` as one process of several reads it (the module docstring):
    a plain ``DataLoader`` re-batched with treadle's sharded samplers (its
    batch size per process; its order, when it shuffles, treadle's seeded
    one), anything else as given, with a warning unless it is sharded."""
    world = comm.get_world_size()
    if world == 1 or not isinstance(loader, torch.utils.data.DataLoader):
        if world > 1 and not isinstance(loader, TrainLoader):  # treadle's loaders are sharded when built
            logger.warning(
                "%s is not a DataLoader: every one of the %d processes reads all of it; shard it yourself, "
                "or give the dataset with batch_size=", type(loader).__name__, world,
            )
        return loader
    plain = type(loader.sampler) in (torch.utils.data.SequentialSampler, torch.utils.data.RandomSampler)
    if not (plain and loader.batch_size is not None and _is_map_dataset(loader.dataset)):
        if not isinstance(loader.sampler, (torch.utils.data.DistributedSampler, InferenceSampler)):
            logger.warning(
                "The %s DataLoader's sampler (%s) is not sharded: every one of the %d processes reads all of it",
                "training" if train else "evaluation", type(loader.sampler).__name__, world,
            )
        return loader
    logger.info(
        "The %s DataLoader is sharded over %d processes: batch_size=%d per process",
        "training" if train else "evaluation", world, loader.batch_size,
    )
    # Batched as a dataset given to the Trainer is, with the DataLoader's settings.
    if train:
        shuffle = isinstance(loader.sampler, torch.utils.data.RandomSampler)
        return as_train_loader(loader.dataset, loader.batch_size, None, num_workers=loader.num_workers, seed=seed,
                               shuffle=shuffle, collate_fn=loader.collate_fn)
    return as_eval_loader(loader.dataset, loader.batch_size, num_workers=loader.num_workers,
                          collate_fn=loader.collate_fn)


def run_length(max_iter: Optional[int], max_epochs: Optional[int], epoch_length: Optional[int]) -> int:
    """The iterations to train: ``max_iter``, ``max_epochs`` epochs, or the fewer of both.
    Warns when ``max_epochs`` stops a run before ``max_iter``: the Hugging Face
    Trainer's ``max_steps`` overrides its epochs."""
    if max_iter is None and max_epochs is None:
        raise ValueError("Give max_iter or max_epochs (or both: training stops at whichever comes first)")
    lengths = [max_iter] if max_iter is not None else []
    if max_epochs is not None:
        if epoch_length is None:
            raise ValueError("max_epochs needs data with a length; this train_loader has none, so give max_iter")
        lengths.append(max_epochs * epoch_length)
    if max_iter is not None and min(lengths) < max_iter:
        logger.warning(
            "max_iter=%d is not reached: max_epochs=%d stops training after %d iterations (whichever comes first); "
            "leave max_epochs out to train max_iter iterations (Hugging Face's max_steps)",
            max_iter, max_epochs, min(lengths),
        )
    return min(lengths)


def warn_about_leftover_batches(loader: Any, grad_accum_steps: int, epoch_length: Optional[int]) -> None:
    """Says, when an epoch's batches do not divide into updates, where the
    ones left over go: Hugging Face, Lightning and pytorch-accelerated end
    each epoch with a shorter update instead."""
    batches = loader_batches(loader)
    if not batches or grad_accum_steps == 1 or batches % grad_accum_steps == 0:
        return
    if batches < grad_accum_steps:
        logger.warning(
            "%d batches per epoch is fewer than grad_accum_steps=%d: an epoch counts as 1 update, "
            "which takes batches of the next pass too", batches, grad_accum_steps,
        )
    else:
        logger.warning(
            "%d batches per epoch is not a multiple of grad_accum_steps=%d: an epoch is %d updates "
            "(%d batches), and the %d batches left over begin the next epoch's first update",
            batches, grad_accum_steps, epoch_length, epoch_length * grad_accum_steps,  # type: ignore[operator]
            batches % grad_accum_steps,
        )
