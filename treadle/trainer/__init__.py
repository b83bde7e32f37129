"""The plain ``Trainer``: ``Trainer(model, optimizer, train_loader, ...)`` for
people who do not want configs.

It sits above the engine (:mod:`treadle.engine`: the loop, the steps, the
default hooks it shares with ``DefaultTrainer``) and uses
:mod:`treadle.compat`, which lets a subclass keep the method names of the
trainers its user comes from. Import it from here:
``from treadle.trainer import Trainer`` (``treadle.engine.Trainer`` is
deprecated).

- :mod:`treadle.trainer.trainer`: the class, its builders, ``train``,
  ``evaluate`` and its one-batch calls;
- :mod:`treadle.trainer.settings`: the one table of its settings, frozen
  dataclasses by purpose (``trainer.settings.evaluation.eval_period``),
  checked before anything is built;
- :mod:`treadle.trainer.data`: what it was given as data, and the loaders;
- :mod:`treadle.trainer.evaluation`: how it evaluates;
- :mod:`treadle.trainer.assembly`: its hooks and writers, from its settings;
- :mod:`treadle.trainer.subclass`: what a subclass's methods of other trainers' names change
  (checked when it is built; its evaluation batch);
- :mod:`treadle.trainer.process`: its process's console, folders and
  process group;
- :mod:`treadle.trainer.run`: its run in its folder (``train()``,
  ``train_epoch()``'s pauses).
"""

from treadle.engine.history import TrainingHistory

from .trainer import Trainer

__all__ = ["Trainer", "TrainingHistory"]
