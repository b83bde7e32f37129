"""Periodic flushing of the event storage to writers."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, cast

from treadle.events.writers import EventWriter

from .base import HookBase

__all__ = ["PeriodicWriter"]


class PeriodicWriter(HookBase):
    """Flushes the storage to ``writers`` every ``period`` iterations and at the end.

    A flush is where published tensors are read: one device sync per flush,
    none in between. Every rank resolves its storage at the same iterations
    (distributed training reduces scalars across ranks there), so register
    this hook on every process and give writers only to the main process.

    Register it last: it writes what the other hooks put at this iteration.
    Writers are told the first iteration of the run in ``before_train``, so
    that after a resume they drop what the interrupted run wrote after its
    checkpoint. The checkpointing hooks call :meth:`flush` before they save a
    resume point, so that a checkpoint is never on disk while values at or
    before its iteration are still unwritten or only buffered (a writer may
    buffer between periods, as TensorBoard's does: see
    :meth:`EventWriter.flush`).

    Writers with ``state_dict``/``load_state_dict`` (the MLflow and W&B
    writers: their run's id) have that state saved in checkpoints with this
    hook's, so that a resumed run logs into the same tracker run.
    """

    def __init__(self, writers: Sequence[EventWriter], period: int = 20) -> None:
        if period < 1:
            raise ValueError(f"PeriodicWriter period must be >= 1, got {period}")
        for w in writers:
            if not isinstance(w, EventWriter):
                raise TypeError(f"PeriodicWriter got {type(w).__name__}, which is not an EventWriter")
        self.writers: List[EventWriter] = list(writers)
        self._period = period

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
        for w in self.writers:
            w.set_start_iter(self.trainer.start_iter)

    def after_step_period(self) -> Optional[int]:
        return self._period

    def after_step(self) -> None:
        # Called at the period only (after_step_period).
        self.write()

    def after_train(self) -> None:
        try:
            self.write()
        finally:
            for w in self.writers:
                w.close()

    def flush(self) -> None:
        """Writes what the storage holds now (one device sync) and waits until
        every writer has it on disk (:meth:`EventWriter.flush`): what a
        checkpoint needs before it is saved. Call it during training only."""
        self.write()
        for w in self.writers:
            w.flush()

    def write(self) -> None:
        """Writes what the storage holds now (one device sync), without waiting
        for writers that buffer; call it during training only."""
        storage = self.trainer.storage
        try:
            storage.flush()
        finally:
            # Even when materialize raises (a non-finite loss), the values were
            # recorded and the writers show them.
            for w in self.writers:
                w.write()
            storage.clear_images()
            storage.clear_histograms()
