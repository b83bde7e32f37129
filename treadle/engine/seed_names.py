"""The seeds' override points that treadle names differently.

A user of pytorch-accelerated, qurious, Lightning or Hezar who subclasses
the plain ``Trainer`` writes the method their trainer calls
(``calculate_train_batch_loss``, ``_compute_loss``...). treadle never calls
it, so the subclass would train with the default loss, silently. The
``Trainer`` warns, once per method when it is built, naming what to
override or give instead (``docs/migrating.md`` maps each one).
"""

from __future__ import annotations

import logging
from typing import Dict

__all__ = ["SEED_METHODS", "warn_about_seed_methods"]

logger = logging.getLogger(__name__)

#: Each seed's method name, and what treadle's is (the warning's words).
SEED_METHODS: Dict[str, str] = {
    "calculate_train_batch_loss": "pytorch-accelerated's; override compute_loss(self, batch)",
    "calculate_eval_batch_loss": "pytorch-accelerated's; override compute_loss(self, batch), the loss of "
    "evaluation too, and give metrics=[...]",
    "train_epoch_end": "pytorch-accelerated's; give callbacks=[fn(trainer, epoch, metrics)] or a hook's after_epoch",
    "eval_epoch_end": "pytorch-accelerated's; give metrics=[...] (torchmetrics objects included)",
    "create_scheduler": "pytorch-accelerated's; give scheduler= (a factory of the optimizer)",
    "_compute_loss": "qurious'; override compute_loss(self, batch), the batch being on the device",
    "_forward_pass": "qurious'; override compute_loss(self, batch), which runs the model",
    "_prepare_batch": "qurious'; batches are moved to the device before compute_loss(self, batch)",
    "training_step": "Lightning's and Hezar's; override compute_loss(self, batch)",
    "configure_optimizers": "Lightning's; give optimizer= and scheduler=",
    "on_train_epoch_end": "Lightning's; give callbacks=[fn(trainer, epoch, metrics)] or a hook's after_epoch",
}


def warn_about_seed_methods(cls: type, base: type) -> None:
    """One warning for each method of :data:`SEED_METHODS` that ``cls``, a
    subclass of ``base`` (the ``Trainer``), defines."""
    for name, instead in SEED_METHODS.items():
        owner = next((c for c in cls.__mro__ if name in vars(c)), None)
        if owner is not None and issubclass(owner, base) and owner is not base:
            logger.warning("%s.%s is never called by treadle: the name is %s (docs/migrating.md)",
                           owner.__name__, name, instead)
