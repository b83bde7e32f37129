"""The names of the trainers treadle's users come from, in one layer.

A user of qurious, pytorch-accelerated, Hezar, LiBai or the Hugging Face
Trainer subclasses the plain :class:`~treadle.engine.Trainer` and overrides
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
  that call them at the loop's stages.

For maintainers. The layer sits above the engine's core (the loop, the step
objects, the hooks, events, checkpoints) and ``DefaultTrainer``'s job layer,
and below the plain ``Trainer`` (:mod:`treadle.trainer`), its one importer;
``tests/compat/test_layers.py`` fails when a core or job module reaches it,
directly or through another module. To add a name: add its row to
``OVERRIDE_POINTS`` or ``SEED_SETTINGS`` in :mod:`~treadle.compat.names`
(called: with the method's default in ``SeedOverrides`` and its call where
that trainer calls it, tested against a hand-written loop of that trainer;
refused: with the words that say what to write instead), then run
``python tools/seed_pages.py`` to regenerate the pages that show the tables.
To remove one, delete its row and its call; the pages' test says what else
still names it.
"""
