"""Checkpoint and exit cleanly when the job is asked to stop."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from treadle.utils import comm

from .base import HookBase
from .checkpointing import PeriodicCheckpointer, flush_writers, trainer_checkpointer
from .writing import PeriodicWriter

if TYPE_CHECKING:
    from treadle.checkpoint import Checkpointer

__all__ = ["PreemptionHandler", "PREEMPTED_EXIT_CODE"]

logger = logging.getLogger(__name__)

#: Exit status after a preemption checkpoint: EX_TEMPFAIL from sysexits.h,
#: "temporary failure, retry later". Schedulers and wrapper scripts can
#: tell it apart from success (0) and from a crash (1) and requeue the job.
PREEMPTED_EXIT_CODE = 75


class PreemptionHandler(HookBase):
    """On SIGTERM or SIGUSR1, checkpoints at the next step boundary and exits.

    The signal handler only sets a flag; the work happens in ``after_step``
    of the iteration running when the signal came: the writers flush, the
    checkpoint ``model_{iter:07d}`` is written (and becomes
    ``last_checkpoint``; no ``model_final`` is written, the run is not
    finished), a stop is requested, every hook's ``after_train`` runs, and
    then the process exits with :data:`PREEMPTED_EXIT_CODE` (``exit_code``;
    the trainer raises the ``SystemExit`` once the hooks registered after
    this one have finished their ``after_train`` too). If a hook raises
    after the stop was requested, that error propagates instead of the exit.
    Resuming from that checkpoint is exact. When the :class:`PeriodicCheckpointer` (same
    checkpointer and prefix) has just saved that iteration, its file is the
    preemption checkpoint: the same state is not written twice.

    With several processes, the ranks agree on the stop every
    ``sync_period`` iterations with one small collective, so that they all
    stop at the same iteration even when the signal reaches them at
    different times. In a single process the hook is due at no iteration
    until the signal comes, then the loop is asked to plan its periods again
    (:meth:`~treadle.engine.TrainerBase.plan_periods_again`): nothing is read
    per iteration.

    When torchrun ends a group because one of its processes died, the
    survivors get SIGTERM too, but no checkpoint can be agreed with a dead
    peer: the agreeing collective fails (at once with gloo, which sees the
    peer's connection closed; at the latest after the group's timeout,
    ``train.dist_timeout``), and the process ends with that error instead
    of waiting, so that torchrun can start the next attempt. Only when every
    rank is alive (a preemption of the whole job) is the checkpoint written.

    A second signal after the checkpoint is written ends the process at
    once with ``exit_code`` (the other hooks' ``after_train`` still run, as
    after any exception in one of them). With several processes the ranks
    also agree at the last iteration, so that a signal in the last partial
    ``sync_period`` stops the run there; the resumed run then only does what
    the end of training does (see :attr:`~treadle.engine.TrainerBase.finished`).

    Any registration order works: the flag is read and the checkpoint taken
    in ``after_iteration``, after every hook's ``after_step`` of that
    iteration; at an iteration where the :class:`PeriodicCheckpointer`
    registered after this hook saves, its save (and the flush before it,
    which writes that iteration's row of ``metrics.json``) runs first.
    Handlers are installed in ``before_train`` (main thread only) and the
    previous ones restored in ``after_train`` (``tools/train_net.py``'s own
    handler then exits with status 75 on a further signal).
    """

    # It flushes the writers and counts its file as one of the periodic
    # checkpointer's when both write the same files.
    uses = (PeriodicCheckpointer, PeriodicWriter)

    def __init__(
        self,
        checkpointer: Optional["Checkpointer"] = None,
        *,
        signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1),
        exit_code: Optional[int] = PREEMPTED_EXIT_CODE,
        sync_period: int = 20,
        file_prefix: str = "model",
    ) -> None:
        self._checkpointer = checkpointer
        self._signals = tuple(signals)
        self.exit_code = exit_code
        self._sync_period = max(int(sync_period), 1)
        self.file_prefix = file_prefix
        self._received: Optional[int] = None
        self._preempted = False
        self._previous: Dict[int, Any] = {}
        self._world_size = 1

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self._preempted and self.exit_code is not None:
            # The checkpoint is written: a second signal (the scheduler's
            # grace period running out, an impatient user) ends the process
            # now, still as a preemption. Raised inside whatever after_train
            # runs; the trainer still runs the other hooks' after_train.
            raise SystemExit(self.exit_code)
        self._received = signum
        if self._world_size == 1:
            # Due at every iteration from now on (after_iteration_period): the
            # loop is asked for its plan again, here rather than by a flag read
            # at each iteration.
            self.trainer.plan_periods_again()

    def before_train(self) -> None:
        self._checkpointer = trainer_checkpointer(self, self._checkpointer)
        self._received = None
        self._preempted = False
        # Fixed for the whole run; after_step reads it every iteration.
        self._world_size = comm.get_world_size()
        if threading.current_thread() is not threading.main_thread():
            logger.warning("PreemptionHandler: not on the main thread, so no signal handler is installed.")
            return
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def after_iteration_period(self) -> Optional[int]:
        # One process: at no iteration until its signal came, then at every
        # one (_handle asks the loop to plan again). Several agree every
        # sync_period, and at the last iteration (runs_at_last_iteration): a
        # signal in the last partial period must stop the run before its
        # (long) end, not be lost.
        if self._world_size == 1:
            return None if self._received is not None else 0
        return self._sync_period

    def _should_stop(self) -> bool:
        if self._world_size == 1:
            return self._received is not None
        import torch

        flag = torch.tensor([1.0 if self._received is not None else 0.0])
        if torch.distributed.get_backend() == "nccl":
            flag = flag.cuda()
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def after_iteration(self) -> None:
        if self._preempted or not self._should_stop():
            return
        it, checkpointer = self.trainer.iter, self._checkpointer
        assert checkpointer is not None  # resolved in before_train
        name = signal.Signals(self._received).name if self._received else "a signal on another rank"
        logger.warning("Received %s: saving a checkpoint at iteration %d and stopping.", name, it)
        periodic = self._periodic_checkpointer()
        if periodic is not None and periodic.last_saved_iter != it and periodic.saves_at(it):
            # Registered after this hook, the periodic checkpointer has not saved this iteration yet: its save,
            # now, with the flush before it that writes this iteration's row (an uninterrupted run has it; the
            # resumed run, which starts after the checkpoint, would never write it).
            periodic.after_iteration()
        # What an uninterrupted run would have written by now (the resumed run writes the rest).
        flush_writers(self, stop=True)
        if periodic is not None and periodic.last_saved_iter == it:
            # Same file, same state: in a grace period a second write is time lost.
            logger.info("The periodic checkpoint of iteration %d was just written; not writing it again.", it)
            checkpointer.wait()  # written in the background: complete it before the grace period ends
        else:
            # Synchronous: the process is about to exit.
            if periodic is not None:
                periodic.save(it, asynchronous=False)  # one of the run's periodic files: counted by its max_to_keep
            else:
                checkpointer.save(f"{self.file_prefix}_{it:07d}", iteration=it, asynchronous=False)
        self._preempted = True
        self.trainer.request_stop(f"preempted by {name}", interrupted=True)

    def _periodic_checkpointer(self) -> Optional[PeriodicCheckpointer]:
        """The PeriodicCheckpointer writing the same files (checkpointer and prefix), if any."""
        for h in self.hooks_of(PeriodicCheckpointer):
            if h.checkpointer is self._checkpointer and h.file_prefix == self.file_prefix:
                return h
        return None

    def after_train(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        # After a crash the trainer re-raises the real error; exiting with
        # "retry later" here would hide it and make the scheduler requeue a
        # job that fails for a reason other than the preemption.
        if self._preempted and self.exit_code is not None and self.trainer.training_error is None:
            logger.info("Exiting with status %d after preemption.", self.exit_code)
            sys.stdout.flush()
            sys.stderr.flush()
            raise SystemExit(self.exit_code)

    @property
    def preempted(self) -> bool:
        """Whether the last training stopped because of a signal."""
        return self._preempted
