"""Where a user's torch ``DataLoader`` is in its pass, and putting it back there at a resume.

A torch ``DataLoader`` keeps no position a checkpoint can hold (treadle's
:class:`~treadle.data.TrainLoader` does). Its pass over the data is a
function of the random generators it draws from when the pass starts,
where its sampler is one of torch's (a ``DistributedSampler``'s order is
its seed's and the epoch :class:`~treadle.data.DataStream` sets): the loader's ``generator`` (the seed of
its workers) and the sampler's (the order), each the global CPU generator
when not given. So a step records those generators' states when it starts
a pass (:func:`generator_states`, once per pass, never per batch), and a
resume sets them back, starts the pass again and drops the batches the
checkpoint had trained (:func:`restore_pass`): the Hugging Face Trainer's
skip of the first batches, with the order restored rather than assumed.

Any other order (a sampler or batch sampler of the user's class, an
``IterableDataset``, persistent workers, which seed a pass before it
starts, batches out of order) cannot be restored: :func:`order_generators`
is None, and the resume says so (``EagerStep``).
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, cast

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

__all__ = ["order_generators", "generator_states", "restore_pass", "why_not_restorable", "why_cannot_restore"]

# torch's samplers whose order depends on nothing but their generator.
_RANDOM_SAMPLERS = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def _sampler(loader: DataLoader) -> Any:
    """The sampler of the indices: under the batch sampler, or the loader's own
    (``batch_size=None``)."""
    return cast(Any, loader.batch_sampler).sampler if loader.batch_sampler is not None else loader.sampler


def why_not_restorable(loader: Any) -> Optional[str]:
    """Why a pass of ``loader`` cannot be started again in the same order,
    in a few words; None when it can."""
    if not isinstance(loader, DataLoader):
        return f"a {type(loader).__name__}, not a DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return "its dataset is an IterableDataset"
    if loader.batch_sampler is not None and type(loader.batch_sampler) is not BatchSampler:
        return f"treadle cannot restore the order of its batch_sampler, {type(loader.batch_sampler).__name__}"
    if loader.num_workers > 0 and not getattr(loader, "in_order", True):
        return "its workers give batches out of order (in_order=False)"
    sampler = _sampler(loader)
    if type(sampler) is SequentialSampler:
        return None
    if type(sampler) not in _RANDOM_SAMPLERS and type(sampler) is not DistributedSampler:
        return f"treadle cannot restore the order of its sampler, {type(sampler).__name__}"
    if loader.num_workers > 0 and loader.persistent_workers:
        return "it shuffles with persistent_workers=True"
    return None


def order_generators(loader: Any) -> Optional[List[torch.Generator]]:
    """The generators a pass of ``loader`` draws from when it starts (the
    global CPU generator for those not given), each once; None when its
    order cannot be restored (:func:`why_not_restorable`)."""
    if why_not_restorable(loader) is not None:
        return None
    generators: List[torch.Generator] = []
    for generator in (loader.generator, getattr(_sampler(loader), "generator", None)):
        generator = generator if generator is not None else torch.default_generator
        if all(generator is not g for g in generators):
            generators.append(generator)
    return generators


def generator_states(generators: List[torch.Generator]) -> List[torch.Tensor]:
    """The states of ``generators`` now, as a checkpoint holds them."""
    return [g.get_state() for g in generators]


def why_cannot_restore(loader: Any, states: Optional[Sequence[torch.Tensor]], batches: int) -> Optional[str]:
    """Why ``loader`` cannot be put back ``batches`` batches into the pass that
    began with the generator ``states`` a checkpoint holds, in a few words;
    None when :func:`restore_pass` can."""
    why = why_not_restorable(loader)
    if why is not None:
        return why
    if len(states or ()) != len(order_generators(loader) or ()):
        return "the checkpoint does not hold its order"
    if batches >= len(loader):
        return f"it has {len(loader)} batches now"
    return None


def restore_pass(loader: DataLoader, states: Sequence[torch.Tensor], batches: int) -> Optional[Iterator[Any]]:
    """Puts ``loader`` back ``batches`` batches into the pass that began with
    the generator ``states`` (:func:`generator_states`): the pass started
    again from them, its first ``batches`` batches read and dropped, and the
    pass's iterator returned; None for ``batches=0``, a pass not started,
    whose first batch the next ``iter(loader)`` gives. The loader's own
    generators go on from there as in the pass; the global one is left as
    it was, since the checkpoint's random state is the training loop's.

    Raises:
        ValueError: where :func:`why_cannot_restore` says why not.
    """
    why = why_cannot_restore(loader, states, batches)
    if why is not None:
        raise ValueError(f"restore_pass: the DataLoader cannot be put back at batch {batches}: {why}")
    global_state = torch.default_generator.get_state()
    iterator = None
    try:
        for generator, state in zip(order_generators(loader) or (), states):
            generator.set_state(state)
        if batches:
            iterator = iter(loader)
            for _ in range(batches):
                next(iterator)
    finally:
        torch.default_generator.set_state(global_state)
    return iterator
