"""What a job writes once training really starts.

``default_setup`` cannot write ``config.yaml`` or ``log.txt`` right away: a
job whose inputs are bad must leave the run's folder as it was. It leaves
those writes here; the trainer performs them when training starts
(``TrainerBase.train``, after the run was built and, for ``DefaultTrainer``,
its folder claimed). A script with its own loop on ``TrainerBase`` (a
detectron2-style ``SimpleTrainer`` script) thus gets its log file and
config too.
"""

from __future__ import annotations

from typing import Callable, Dict, Set

__all__ = ["when_training_starts", "training_starts", "forget_pending_starts"]

_pending: Dict[str, Callable[[], object]] = {}


def when_training_starts(label: str, action: Callable[[], object]) -> None:
    """Runs ``action()`` when training starts; a later action of the same
    ``label`` replaces an earlier one (a second ``default_setup``)."""
    _pending[label] = action


def training_starts() -> Set[str]:
    """Runs the pending actions, once; returns their labels."""
    actions = list(_pending.items())
    _pending.clear()
    for _, action in actions:
        action()
    return {label for label, _ in actions}


def forget_pending_starts() -> None:
    """Drops the pending actions (a job that ends before training)."""
    _pending.clear()
