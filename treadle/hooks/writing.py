"""Periodic flushing of the event storage to writers."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence, cast

from treadle.events.writers import EventWriter

from .base import HookBase

__all__ = ["PeriodicWriter"]


class PeriodicWriter(HookBase):
    """Flushes the storage to ``writers`` every ``period`` iterations and at the end.

    A flush is where published tensors are read: one device-to-host copy
    per flush, none in between. Every rank resolves its storage at the same
    iterations (distributed training reduces scalars across ranks there),
    so register this hook on every process; treadle's writers write on the
    main process only by themselves (see
    :class:`~treadle.events.EventWriter`), so every process may get the same.

    **A flush that does not wait for the device.** Where the period's values
    are on an accelerator (``defer=None``, the default), the periodic flush
    only starts their copy to host memory, and the writers write the rows of
    the flush before, whose copy has long completed: the host never waits
    for the device's queue to drain, and the rows reach the files one period
    later. The rows are those of a flush that waits, each once and in order
    (``metrics.json``, TensorBoard, CSV and the trackers alike); every flush
    outside the period (before a checkpoint, at the end of training, after
    an exception or at a preemption) waits, and writes what was deferred.
    ``defer=False`` waits at every flush; ``defer=True`` defers the rows of
    values in host memory too (nothing is gained on the CPU: it is how the
    deferred path is tested there). Hooks that need a value at once (a best
    checkpoint, early stopping) read the storage, which waits for it then.

    Register it last: it writes what the other hooks put at this iteration.
    Writers are told the first iteration of the run in ``before_train``, so
    that after a resume they drop what the interrupted run wrote after its
    checkpoint. The checkpointing hooks call :meth:`flush` before they save a
    resume point, so that a checkpoint is never on disk while values at or
    before its iteration are still unwritten or only buffered (a writer may
    buffer between periods, as TensorBoard's does: see
    :meth:`~treadle.events.EventWriter.flush`).

    **A stop to be resumed** (:class:`PreemptionHandler` calls
    ``flush(stop=True)``) writes what an uninterrupted run would have
    written by then: the rows of the flushes so far and every evaluation
    result. The training values of the unfinished period are in the
    checkpoint, and the resumed run writes them in its next row, as the
    uninterrupted run does: ``metrics.json`` then holds the same rows.

    Writers with ``state_dict``/``load_state_dict`` (the MLflow and W&B
    writers: their run's id) have that state saved in checkpoints with this
    hook's, so that a resumed run logs into the same tracker run.
    """

    def __init__(self, writers: Sequence[EventWriter], period: int = 20, *, defer: Optional[bool] = None) -> None:
        if period < 1:
            raise ValueError(f"PeriodicWriter period must be >= 1, got {period}")
        if defer not in (None, True, False):
            raise ValueError(f"PeriodicWriter defer must be None (on an accelerator), True or False, got {defer!r}")
        for w in writers:
            if not isinstance(w, EventWriter):
                raise TypeError(f"PeriodicWriter got {type(w).__name__}, which is not an EventWriter")
        self.writers: List[EventWriter] = list(writers)
        self._period = period
        self.defer = defer
        # The iteration of a deferred flush whose rows are not written yet.
        self._deferred_at: Optional[int] = None
        # The last flush an uninterrupted run makes too (the period's, a checkpoint's).
        self._flushed_at = -1
        # After flush(stop=True): the run stops to be resumed.
        self._stopping = False

    def state_dict(self) -> Dict[str, Any]:
        """The states of the writers that have one (a tracker's run id), by
        ``{index}:{class name}``; saved in checkpoints."""
        states = {
            f"{i}:{type(w).__name__}": cast(Any, w).state_dict()
            for i, w in enumerate(self.writers)
            if callable(getattr(w, "state_dict", None))
        }
        return {"writers": states} if states else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        for i, w in enumerate(self.writers):
            saved = state.get("writers", {}).get(f"{i}:{type(w).__name__}")
            if saved is not None and callable(getattr(w, "load_state_dict", None)):
                cast(Any, w).load_state_dict(saved)

    def before_train(self) -> None:
        self._deferred_at, self._stopping = None, False
        self._flushed_at = self.trainer.start_iter - 1
        for w in self.writers:
            w.set_start_iter(self.trainer.start_iter)

    def after_step_period(self) -> Optional[int]:
        return self._period

    def after_step(self) -> None:
        # Called at the period only (after_step_period).
        defer = self.defer if self.defer is not None else self.trainer.storage.device_values_pending()
        self.write(defer=defer)

    def after_train(self) -> None:
        try:
            if self._stopping and self.trainer.training_error is None:
                self._write(defer=False, rows_through=self._flushed_at)
            else:
                self.write()
        finally:
            for w in self.writers:
                w.close()

    def flush(self, *, stop: bool = False) -> None:
        """Writes what the storage holds now (waiting for the device) and
        waits until every writer has it on disk (:meth:`~treadle.events.EventWriter.flush`):
        what a checkpoint needs before it is saved. ``stop=True``: the run
        stops here to be resumed (see the class docstring). Call it during
        training only."""
        if stop:
            self._stopping = True
            self._write(defer=False, rows_through=self._flushed_at)
        else:
            self.write()
        for w in self.writers:
            w.flush()

    def write(self, *, defer: bool = False) -> None:
        """Writes what the storage holds now, without waiting for writers that
        buffer; ``defer=True``: the rows of the flush before, without waiting
        for the device (see the class docstring). Call it during training only."""
        self._write(defer=defer, rows_through=None)
        self._flushed_at = self.trainer.storage.iter

    def _write(self, *, defer: bool, rows_through: Optional[int]) -> None:
        storage = self.trainer.storage
        deferred_at = self._deferred_at
        try:
            storage.flush(defer=defer)
        finally:
            # Even when the flush raises (a non-finite loss), the values were
            # recorded and the writers show them.
            self._deferred_at = storage.iter if defer else None
            try:
                if deferred_at is not None:
                    # The rows of the deferred flush first, as it would have written them.
                    with storage.as_of(deferred_at):
                        self._write_rows()
                    if not defer:  # images and histograms went with them
                        storage.clear_images()
                        storage.clear_histograms()
                if not defer:
                    stop = storage.as_of(rows_through, every_result=True) if rows_through is not None else None
                    with stop or contextlib.nullcontext():
                        self._write_rows()
            finally:
                storage.clear_images()
                storage.clear_histograms()

    def _write_rows(self) -> None:
        for w in self.writers:
            w.write()
