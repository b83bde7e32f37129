"""Runs a research example's ``main`` the way ``python -m <module>`` does, and,
with ``RESEARCH_KILL_AT=K`` in the environment, SIGKILLs its process group at
the end of iteration K (``after_step``, after the writers wrote its row).

Usage: ``python tests/examples/research_run.py MODULE [the example's arguments]``.

The hook is added by wrapping ``TrainerBase.train`` at import: the workers
that ``launch`` spawns import this file again (as ``__mp_main__``), so each
rank's trainer gets it; rank 0's kills them all, the launcher included, as
``kill -9`` of a job's process group does.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import sys

from treadle.engine import HookBase, TrainerBase
from treadle.hooks import PeriodicWriter
from treadle.utils import comm


class KillAt(HookBase):
    """SIGKILLs this process's group in ``after_step`` of iteration ``iteration``, on rank 0,
    after every rank flushed its writers (a flush is a collective on several processes)."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_step(self) -> None:
        if self.trainer.iter != self.iteration:
            return
        for hook in self.trainer.hooks:  # the rows up to this iteration reach the file first
            if isinstance(hook, PeriodicWriter):
                hook.flush()
        if comm.get_rank() == 0:
            os.killpg(os.getpgrp(), signal.SIGKILL)


def _install(kill_at: int) -> None:
    train = TrainerBase.train

    @functools.wraps(train)
    def train_then_die(self: TrainerBase, start_iter: int, max_iter: int) -> None:
        self.register_hooks([KillAt(kill_at)])
        train(self, start_iter, max_iter)

    TrainerBase.train = train_then_die  # type: ignore[method-assign]


if os.environ.get("RESEARCH_KILL_AT"):
    _install(int(os.environ["RESEARCH_KILL_AT"]))

if __name__ == "__main__":
    module = importlib.import_module(sys.argv[1])
    module.main(sys.argv[2:])
