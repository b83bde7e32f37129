"""The plain ``Trainer``'s run in its folder: what ``train()`` and
``train_epoch()`` do once their arguments are checked.

A run opens its :class:`~treadle.engine.session.RunSession` (the folder
claimed, a checkpoint resumed) and trains to ``max_iter``; ``train_epoch()``
pauses it after one epoch as a preempted run is paused, and the next call goes
on from there. A second ``train()`` of a trained ``Trainer`` is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treadle.compat.names import refuse_methods_set_on_instance
from treadle.engine.history import TrainingHistory, iteration_history
from treadle.engine.session import Resume
from treadle.engine.train_loop import TrainerBase

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["run", "refuse_second_train"]


def refuse_second_train(trainer: Trainer) -> None:
    """Refuses ``train()`` on a ``Trainer`` that has trained (it would start over on the trained weights)."""
    if trainer.last_run_iter + 1 >= trainer.max_iter and trainer._by_epochs:
        raise RuntimeError(
            f"train_epoch() has trained every epoch of the run (to iteration {trainer.last_run_iter}, "
            f"max_iter={trainer.max_iter}): there is nothing left for train(); raise max_epochs in a new "
            "Trainer to train further")
    raise RuntimeError(
        f"this Trainer has trained already (to iteration {trainer.last_run_iter}): a second train() would "
        "start the run over on the trained weights. Continue a stopped run with train(resume=True), or "
        "build a new Trainer"
    )


def run(trainer: Trainer, resume: Resume, *, move_aside: bool = False, continuing: bool = False) -> TrainingHistory:
    """``train()``'s body; ``continuing``: go on from where this process's
    last training stopped (``train_epoch()``), with its recent values."""
    refuse_methods_set_on_instance(trainer)
    trainer._in_training = True
    try:
        if continuing:
            trainer.session.claim(resume=True)
            start_iter = trainer.last_run_iter + 1
            trainer._restored_storage = trainer.storage.recent_state()
        else:
            start_iter = trainer.session.open(trainer, resume=resume, move_aside=move_aside)
        trainer._trained = True
        with trainer.session.running(trainer.has_work(start_iter, trainer.max_iter)):
            TrainerBase.train(trainer, start_iter, trainer.max_iter)
        trainer._paused = trainer._pause_after_epoch is not None and trainer.interrupted
        if hasattr(trainer, "storage"):
            trainer.history.iterations = iteration_history(trainer.storage)
        return trainer.history
    finally:
        trainer._in_training = False
