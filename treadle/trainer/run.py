"""The plain ``Trainer``'s run in its folder: what ``train()`` and
``train_epoch()`` do once their arguments are checked.

A run opens its :class:`~treadle.engine.session.RunSession` (the folder
claimed, a checkpoint resumed) and trains to ``max_iter`` with
:class:`~treadle.engine.train_loop.TrainerBase`'s loop; ``train_epoch()``
pauses it after one epoch as a preempted run is paused, and the next call
goes on from there. A second ``train()`` of a trained ``Trainer`` is refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

import torch

from treadle.compat.names import refuse_methods_set_on_instance
from treadle.engine.history import TrainingHistory, iteration_history
from treadle.engine.session import Resume, RunSession
from treadle.engine.train_loop import TrainerBase
from treadle.utils.threads import apply_num_threads, restore_num_threads

if TYPE_CHECKING:
    from .settings import TrainerSettings

__all__ = ["TrainerRun"]

logger = logging.getLogger(__name__)


class TrainerRun(TrainerBase):
    """:class:`~treadle.engine.train_loop.TrainerBase` with the plain
    ``Trainer``'s run in its session, which its ``train()`` and
    ``train_epoch()`` call."""

    session: RunSession
    history: TrainingHistory
    settings: TrainerSettings
    device: torch.device
    #: The epoch after which ``train_epoch()`` pauses the run, while it trains.
    _pause_after_epoch: Optional[int] = None
    #: Whether this Trainer has trained, is paused between ``train_epoch()``
    #: calls, has trained by ``train_epoch()``, is training now.
    _trained = _paused = _by_epochs = _in_training = False

    def _refuse_second_train(self) -> None:
        """Refuses ``train()`` once this ``Trainer`` has trained (it would start over on the trained weights)."""
        if self.last_run_iter + 1 >= self.max_iter and self._by_epochs:
            raise RuntimeError(
                f"train_epoch() has trained every epoch of the run (to iteration {self.last_run_iter}, "
                f"max_iter={self.max_iter}): there is nothing left for train(); raise max_epochs in a new "
                "Trainer to train further")
        raise RuntimeError(
            f"this Trainer has trained already (to iteration {self.last_run_iter}): a second train() would "
            "start the run over on the trained weights. Continue a stopped run with train(resume=True), or "
            "build a new Trainer"
        )

    def _run(self, resume: Resume, *, move_aside: bool = False, continuing: bool = False) -> TrainingHistory:
        """``train()``'s body; ``continuing``: go on from where this process's
        last training stopped (``train_epoch()``), with its recent values."""
        refuse_methods_set_on_instance(self)
        self._in_training = True
        # The user's process: its thread count is this run's while it trains, and theirs again after.
        threads = apply_num_threads(self.settings.processes.num_threads, self.device, name="num_threads")
        logger.info("CPU threads: %s", threads.describe())
        try:
            return self._run_in_session(resume, move_aside=move_aside, continuing=continuing)
        finally:
            self._in_training = False
            restore_num_threads(threads)

    def _run_in_session(self, resume: Resume, *, move_aside: bool, continuing: bool) -> TrainingHistory:
        if continuing:
            self.session.claim(resume=True)
            start_iter = self.last_run_iter + 1
            self._restored_storage = self.storage.recent_state()
        else:
            start_iter = self.session.open(self, resume=resume, move_aside=move_aside)
        self._trained = True
        with self.session.running(self.has_work(start_iter, self.max_iter)):
            super().train(start_iter, self.max_iter)
        self._paused = self._pause_after_epoch is not None and self.interrupted
        if hasattr(self, "storage"):
            self.history.iterations = iteration_history(self.storage)
        return self.history
