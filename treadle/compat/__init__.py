"""The names of the trainers treadle's users come from, in one layer.

A user of qurious, pytorch-accelerated, Hezar, LiBai or the Hugging Face
Trainer subclasses the plain :class:`~treadle.trainer.Trainer` and overrides
the methods their trainer calls (``train_step``,
``calculate_train_batch_loss``, ``training_step``...), or writes callbacks
with their trainer's event names. This package is what answers them, and the
only place that knows those trainers. Its code calls those trainers the
*seeds* (treadle was made from their documents): ``SeedOverrides``,
``SEED_SETTINGS``, "the seed's name" mean "that trainer's".

- :mod:`treadle.compat.names`: the one table of their override points and
  setting names, each row called (at that trainer's moment, with its
  arguments and meaning) or refused in one line when the trainer is built;
- :mod:`treadle.compat.overrides`: the calling of them: the defaults of the
  called methods (``SeedOverrides``, a base of the ``Trainer``);
- :mod:`treadle.compat.step`: the step a subclass's update points get
  (``TrainerStep``), which writes the seeds' update once, whole;
- :mod:`treadle.compat.events`: pytorch-accelerated's events, and the hooks
  that call them at the loop's stages;
- :mod:`treadle.compat.schedule`: pytorch-accelerated's ``scheduler_step``,
  the schedule stepped by a subclass's method where treadle steps it;
- :mod:`treadle.compat.libai`: LiBai's spelling of a step's constructor and
  its config's ``graph.enabled``, read through seams of the core that this
  package fills when imported.

For maintainers. The layer sits above the engine's core (the loop, the step
objects, the hooks, events, checkpoints) and ``DefaultTrainer``'s job layer,
and below its two importers: the plain ``Trainer`` (:mod:`treadle.trainer`)
and the command line job (:mod:`treadle.tools.train_net`, for LiBai's
configs); ``tests/compat/test_layers.py`` fails when a core or job module
reaches it, directly or through another module. Where the core must answer
another trainer's name, it offers a neutral seam that this package fills
(``treadle.engine.steps.POSITIONAL_HINTS``,
:data:`~treadle.config.other_nodes.OTHER_NODES`,
:meth:`~treadle.hooks.LRScheduler.step_schedule`). To add a name: add its row to
``OVERRIDE_POINTS`` or ``SEED_SETTINGS`` in :mod:`~treadle.compat.names`
(called: with the method's default in ``SeedOverrides`` and its call where
that trainer calls it, tested against a hand-written loop of that trainer;
refused: with the words that say what to write instead), then run
``python tools/seed_pages.py`` to regenerate the pages that show the tables.
To remove one, delete its row and its call; the pages' test says what else
still names it.
"""

from . import libai  # noqa: E402,F401  # fills the core's seams for LiBai's names
