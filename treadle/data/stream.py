"""A step's training data: batches without end, with a position a checkpoint keeps.

A :class:`DataStream` is what a step reads its batches from, whichever step
it is (:class:`~treadle.engine.EagerStep` holds one; a research step of
one's own holds one in one line, ``self.data = DataStream(loader)``, and
reads ``next(self.data)``). It starts a new pass over its loader when one
ends (iterations, not epochs, bound training), knows which pass it is in
and how many batches of it were taken, and its ``state_dict`` puts it back
exactly at a resume:

- a loader with ``state_dict``/``load_state_dict`` (treadle's
  :class:`~treadle.data.TrainLoader`, torchdata's ``StatefulDataLoader``)
  keeps its own position;
- a torch ``DataLoader`` whose order can be restored (torch's samplers,
  :mod:`treadle.data.dataloader_position`) is put back at its batch: the
  pass started again from the generator states it began with, the batches
  already trained read and dropped;
- another iterable with a length (a class of one's own with ``__iter__``
  and ``__len__``) restarts at its first batch: treadle cannot know that it
  gives its batches in the same order again; a resume inside a pass says so
  in one line, naming the class, the batch and the pass;
- a list or tuple of batches, or an iterable without a length (a
  generator), keeps no position: it restarts at its first batch.

A sampler with ``set_epoch`` (torch's ``DistributedSampler``) is given the
pass's index before each pass, so that each pass is shuffled anew, as a
hand-written loop calling ``sampler.set_epoch(epoch)`` does (and unlike
``itertools.cycle``, which replays the first pass forever).

The position is the process's own: on several processes each rank's stream
is saved and put back on its rank (the trainer's checkpoint keeps every
rank's step state).
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, Iterator, List, Optional, cast

import torch

from treadle.utils.device import to_device
from treadle.utils.torch_internals import dataloader_batches_taken

from .dataloader_position import generator_states, order_generators, restore_pass, why_cannot_restore

__all__ = ["DataStream"]

logger = logging.getLogger(__name__)


class DataStream:
    """Batches of ``loader`` without end, each pass after the other, with the
    position (pass and batch) that a checkpoint saves and a resume restores.

    Args:
        loader: any iterable of batches, iterated again when a pass ends: a
            torch ``DataLoader``, treadle's ``build_train_loader(...)``, a
            list of batches, a class of one's own with ``__iter__``.
        device: where each batch is moved (tensors in tuples, lists and
            dicts); ``None`` or a CPU device: as the loader gives it.

    Attributes:
        passes: the pass being read, from 0 (the epoch of a ``DataLoader``).
    """

    def __init__(self, loader: Iterable[Any], device: Optional[torch.device | str] = None) -> None:
        if loader is not None and not hasattr(loader, "__iter__"):
            raise TypeError(f"DataStream takes an iterable of batches (a DataLoader, a list...), "
                            f"got {type(loader).__name__}")
        self.loader = loader
        self.device: Optional[torch.device] = torch.device(device) if device is not None else None
        self.passes = 0
        #: The iterator over the pass being read; None until its first batch is taken.
        self.iterator: Optional[Iterator[Any]] = None
        # The states of the generators the pass being read drew its order from (a resume inside it).
        self._pass_start: Optional[List[torch.Tensor]] = None
        self._warned_no_state = False

    def __iter__(self) -> "DataStream":
        return self

    def __next__(self) -> Any:
        """The next batch, on ``device``; a new pass starts when one ends."""
        if self.iterator is None:
            self.iterator = self._start_pass()
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.passes += 1
            self.iterator = self._start_pass()
            try:
                batch = next(self.iterator)
            except StopIteration:
                raise RuntimeError(f"The training data ({type(self.loader).__name__}) yields no batches.") from None
        device = self.device
        # A CPU batch is taken as it is: walking it costs microseconds per batch.
        return batch if device is None or device.type == "cpu" else to_device(batch, device)

    def restart(self) -> None:
        """Has the next batch come from a new pass over ``loader`` (a loader
        replaced, or its position restored)."""
        self.iterator = None

    def _start_pass(self) -> Iterator[Any]:
        """A new pass over the loader; once per pass, never per batch: the
        sampler told its epoch, and the states its order comes from recorded
        first, for a resume inside it."""
        if self.loader is None:
            raise RuntimeError("This DataStream has no loader (None): give it one (stream.loader = ...) "
                               "before reading batches")
        sampler = _sampler_with_epoch(self.loader)
        if sampler is not None:
            sampler.set_epoch(self.passes)
        generators = order_generators(self.loader)
        self._pass_start = generator_states(generators) if generators is not None else None
        return _CountedPass(iter(self.loader)) if _counted(self.loader) else iter(self.loader)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """``{"data": loader.state_dict()}`` for a loader with one; for a torch
        ``DataLoader``, ``{"data_pass": {"epoch", "batch", "generators"}}``;
        for another iterable with a length, ``{"data_pass": {"epoch", "batch"}}``;
        else ``{}``."""
        if hasattr(self.loader, "state_dict"):
            return {"data": cast(Any, self.loader).state_dict()}
        data_pass = self._data_pass_state()
        return {"data_pass": data_pass} if data_pass is not None else {}

    def load_state_dict(self, state: Dict[str, Any], *, where: str = "") -> None:
        """Puts the stream back where ``state`` says; what cannot be put back
        is said in one line (``where``: the iteration, for that line)."""
        has_state = hasattr(self.loader, "load_state_dict")
        if "data" in state:
            if has_state:
                cast(Any, self.loader).load_state_dict(state["data"])
            else:
                logger.warning(
                    "The checkpoint has a data position, but the data loader (%s) cannot load it: "
                    "the data stream restarts from its beginning.", type(self.loader).__name__,
                )
        elif not has_state and "data_pass" not in state and not self._warned_no_state:
            self._warned_no_state = True
            logger.warning(
                "The data loader (%s) has no state_dict(): a resumed run restarts its data stream. "
                "Use treadle.data.build_train_loader for an exact resume.", type(self.loader).__name__,
            )
        self.restart()
        if "data_pass" in state and not has_state:
            self._continue_pass(state["data_pass"], where)

    def _data_pass_state(self) -> Optional[Dict[str, Any]]:
        """Where a torch ``DataLoader`` is: ``epoch`` (its pass, from 0), ``batch``
        (those taken in it) and, where its order can be restored, the states
        of its generators when the pass began (:mod:`treadle.data.dataloader_position`)."""
        loader, iterator = self.loader, self.iterator
        if not isinstance(loader, torch.utils.data.DataLoader):
            return self._counted_pass_state()
        taken = dataloader_batches_taken(iterator) if iterator is not None else 0
        if taken is None:
            return None
        generators = order_generators(loader)
        if generators is not None and iterator is not None and taken == len(loader):
            # A pass read to its end is ended here, which draws what its end draws (RandomSampler's
            # generator), so that what is saved is where the next pass starts: else a resume would
            # read a whole pass again to get there.
            next(iterator, None)
            self.iterator, self.passes, taken = None, self.passes + 1, 0
        state: Dict[str, Any] = {"epoch": self.passes, "batch": taken}
        if generators is not None:
            state["generators"] = self._pass_start if taken else generator_states(generators)
        return state

    def _counted_pass_state(self) -> Optional[Dict[str, Any]]:
        """Where an iterable with a length, not a ``DataLoader``, is: its pass
        and the batches taken in it (a pass read to its end is the next one's start)."""
        if not _counted(self.loader):
            return None
        iterator = self.iterator
        taken = iterator.taken if isinstance(iterator, _CountedPass) else 0
        if taken and taken == _length(self.loader):
            return {"epoch": self.passes + 1, "batch": 0}
        return {"epoch": self.passes, "batch": taken}

    def _continue_pass(self, saved: Dict[str, Any], where: str) -> None:
        """Puts a torch ``DataLoader`` back where the checkpoint's ``data_pass``
        says it was (reading the batches of the pass already trained once);
        where its order cannot be restored, says so in one line."""
        if not isinstance(self.loader, torch.utils.data.DataLoader):
            self._continue_counted_pass(saved, where)
            return
        self.passes, taken = int(saved["epoch"]), int(saved["batch"])
        states: List[torch.Tensor] = list(saved.get("generators") or ())
        why = why_cannot_restore(self.loader, states, taken)
        if why is not None:
            if taken:
                logger.warning(
                    "Resuming at %sbatch %d of epoch %d: this DataLoader cannot be put back at that batch (%s), "
                    "so it starts again at its first batch; give the dataset with batch_size= "
                    "(treadle.data.build_train_loader) for an exact resume", where, taken, self.passes, why,
                )
            return
        if taken:
            logger.info("Resuming the DataLoader at batch %d of epoch %d: reading the %d batches before it",
                        taken, self.passes, taken)
            sampler = _sampler_with_epoch(self.loader)
            if sampler is not None:
                sampler.set_epoch(self.passes)
        self.iterator = restore_pass(cast(torch.utils.data.DataLoader, self.loader), states, taken)
        self._pass_start = states

    def _continue_counted_pass(self, saved: Dict[str, Any], where: str) -> None:
        """Puts an iterable with a length back at its pass: a list or tuple of
        batches at its batch (their order is theirs); any other one resumed
        inside a pass starts it again at its first batch, and says so in one line."""
        self.passes, taken = int(saved["epoch"]), int(saved["batch"])
        if not taken:
            return
        if isinstance(self.loader, (list, tuple)) and taken < len(self.loader):
            self.iterator = _CountedPass(iter(self.loader[taken:]), taken)
            return
        kind = type(self.loader).__name__
        logger.warning(
            "Resuming at %sbatch %d of epoch %d: %s is not a DataLoader and has no state_dict(), so it cannot be "
            "put back at that batch and starts again at its first batch; batch the dataset with "
            "treadle.data.build_train_loader (the Trainer's batch_size=), or give %s state_dict() and "
            "load_state_dict(), for an exact resume",
            where, taken, self.passes, kind, kind,
        )


class _CountedPass:
    """A pass over an iterable that keeps no position of its own: its batches,
    and how many of them were taken (what a checkpoint saves)."""

    __slots__ = ("iterator", "taken")

    def __init__(self, iterator: Iterator[Any], taken: int = 0) -> None:
        self.iterator = iterator
        self.taken = taken

    def __iter__(self) -> "_CountedPass":
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self.taken += 1
        return batch


def _counted(loader: Any) -> bool:
    """Whether the stream counts the batches of ``loader``'s passes itself: an
    iterable with a length that is not a ``DataLoader`` and keeps no state
    (a list of batches, a class of one's own)."""
    return (
        loader is not None
        and not isinstance(loader, torch.utils.data.DataLoader)
        and not hasattr(loader, "state_dict")
        and hasattr(type(loader), "__len__")
    )


def _length(loader: Any) -> Optional[int]:
    try:
        return len(loader)
    except TypeError:  # a __len__ that says it has none
        return None


def _sampler_with_epoch(loader: Any) -> Any:
    """The sampler of a torch ``DataLoader`` that takes its epoch (``set_epoch``), or None."""
    if not isinstance(loader, torch.utils.data.DataLoader):
        return None
    sampler = loader.batch_sampler.sampler if loader.batch_sampler is not None else loader.sampler  # type: ignore[attr-defined]
    return sampler if callable(getattr(sampler, "set_epoch", None)) else None
