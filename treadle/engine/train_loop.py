"""The iteration loop: hooks around a swappable step object.

Read :meth:`TrainerBase.train` and ``TrainerBase._run_iterations`` for
an iteration; which hooks run at each stage is decided in
:mod:`treadle.engine.hook_table`, what a checkpoint records of the trainer in
:mod:`treadle.engine.trainer_state`.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Collection, Dict, List, Optional, Sequence, cast

from treadle.events import EventStorage
from treadle.events.distributed import reduce_across_ranks
from treadle.hooks.base import HookBase, TrainerProtocol
from treadle.utils import comm
from treadle.utils.frame_stack import call_with_frame_room
from treadle.utils.run_start import training_starts
from treadle.utils.signatures import required_positional

from .hook_table import HookOrderError, HookTable, note_origin
from .steps import StepBase, unknown_data_position
from .time_table import log_time_table
from .trainer_state import capture_state, hook_state_keys, restore_hook_states, restore_rng, step_state_of_this_rank

__all__ = ["TrainerBase", "HookOrderError"]

logger = logging.getLogger(__name__)

# The stages called inside the iteration loop: their time is not the step's.
_ITERATION_STAGES = ("before_epoch", "before_step", "after_backward", "after_step", "after_epoch", "after_iteration")


class TrainerBase:
    """Runs hooks around ``run_step``, ``max_iter - start_iter`` times.

    Invariant: inside every hook call, ``self.iter`` is the iteration being
    run and ``self.storage.iter == self.iter``. After the loop, during
    ``after_train``, ``self.iter`` is one past the last iteration run.

    ``run_step`` delegates to ``self.step``, a :class:`StepBase`; assigning
    another step object is the supported way to change what an iteration does.
    The trainer knows nothing of models, optimizers or data.

    Attributes:
        iter: the current iteration.
        start_iter: the iteration training (re)started at.
        max_iter: the iteration training ends before.
        storage: the :class:`~treadle.events.EventStorage` opened by :meth:`train`.
        nonfinite_check: passed to the ``EventStorage``: ``"flush"``, ``"step"`` or ``"off"``.
        history_length: values the ``EventStorage`` keeps per scalar name.
        epoch_length: iterations per epoch when the data has a length (set by
            whoever builds the trainer); hooks with periods in epochs and
            ``after_epoch`` need it.
        epoch: the 0-based index of the epoch being run, from its
            ``before_epoch`` (or, in a run resumed inside it, its first
            iteration) to its ``after_epoch``, the index of the epoch that ended.
        iter_start_time: ``time.perf_counter()`` when the current iteration
            began, before any ``before_step`` hook.
        step_end_time: ``time.perf_counter()`` when the current iteration's
            step returned, before any ``after_step`` hook. With
            ``iter_start_time`` it times an iteration without a clock read of
            the hook's own (see :class:`~treadle.hooks.IterationTimer`).
        training_error: during ``after_train``, the exception that ended
            training, or ``None`` when it ended normally or by a stop request.
        finished: whether the run is complete: set when training ended
            without an error or an interruption, before the ``after_train``
            hooks run, so that the final checkpoint records it. A resumed
            run at ``max_iter`` whose checkpoint is not finished (a
            preemption at the last iteration) runs ``before_train`` and
            ``after_train`` without iterations: the final evaluation and
            checkpoint happen then.
        interrupted: during ``after_train``, whether a stop request said the
            run was cut short to be resumed later (see :meth:`request_stop`).
    """

    def __init__(
        self, step: Optional[StepBase] = None, *, nonfinite_check: str = "flush", history_length: int = 10_000
    ) -> None:
        self._table = HookTable()
        self.iter: int = 0
        self.start_iter: int = 0
        self.max_iter: int = 0
        self.storage: EventStorage
        self.nonfinite_check = nonfinite_check
        self.history_length = history_length
        self._step: Optional[StepBase] = None
        self._stop_reason: Optional[str] = None
        # The last iteration whose step ran: what a checkpoint records.
        self._last_run_iter = -1
        self.epoch_length: Optional[int] = None
        self.epoch: Optional[int] = None
        self.training_error: Optional[BaseException] = None
        self.interrupted = False
        self.finished = False
        # Of the checkpoint loaded into this trainer: whether its run had
        # finished (None: nothing loaded, or a checkpoint without the flag).
        self._loaded_finished: Optional[bool] = None
        self._loaded_max_iter: Optional[int] = None
        self._restored_storage: Optional[Dict[str, Any]] = None
        # The step whose data position the first checkpoint checked (unknown_data_position).
        self._data_position_checked: Optional[StepBase] = None
        self.iter_start_time = 0.0
        self.step_end_time = 0.0
        self._loop_started: Optional[float] = None
        self._loop_seconds: Optional[float] = None
        self._loop_hook_seconds = 0.0
        if step is not None:
            self.step = step

    # ------------------------------------------------------------------ parts
    @property
    def step(self) -> StepBase:
        if self._step is None:
            raise RuntimeError("The trainer has no step object: assign one with `trainer.step = ...`.")
        return self._step

    @step.setter
    def step(self, step: StepBase) -> None:
        if not isinstance(step, StepBase):
            raise TypeError(f"trainer.step must be a StepBase, got {type(step).__name__}")
        if required_positional(step.run_step) > 0:
            raise TypeError(f"{type(step).__name__}.run_step takes arguments, and the trainer calls step.run_step() "
                            "with none: get each batch with self.next_batch()")
        step.trainer = cast(TrainerProtocol, weakref.proxy(self))
        self._step = step

    @property
    def hooks(self) -> List[HookBase]:
        return list(self._table.hooks)

    def register_hooks(self, hooks: Sequence[Optional[HookBase]]) -> None:
        """Appends hooks; ``None`` entries are skipped; list order is call order.

        Raises:
            TypeError: an entry is not a :class:`HookBase`; it has a public
                method named like a stage (``before_*``, ``after_*``,
                ``on_*``) that is neither a stage nor one of
                :meth:`hook_methods_called`, or a stage that takes arguments.
            HookOrderError: a hook would run before a hook it must follow
                (see :attr:`HookBase.runs_after`).
        """
        for h in self._table.register(hooks, self.hook_methods_called):
            # A proxy, not a reference: the trainer holds its hooks, and a
            # cycle would keep both alive after the trainer is dropped.
            h.trainer = cast(TrainerProtocol, weakref.proxy(self))

    def hook_methods_called(self, hook: HookBase) -> Collection[str]:
        """The methods of ``hook`` this trainer calls besides its stages: none.

        A trainer that calls more (the plain ``Trainer`` calls the callback
        events of the hooks it is given) names them here; ``register_hooks``
        refuses any other public method of a hook named like a stage.
        """
        return ()

    def request_stop(self, reason: str, *, interrupted: bool = False) -> None:
        """Ends training after the current iteration; ``after_train`` runs as on success.

        Args:
            reason: logged, and kept in :attr:`stop_reason`.
            interrupted: the run is cut short and will be resumed (a
                preemption), as opposed to finished early (early stopping).
                Hooks then skip what marks a finished run: the final
                evaluation and ``model_final``.
        """
        if self._stop_reason is None:
            logger.info("Stop requested at iteration %d: %s", self.iter, reason)
            self._stop_reason = reason
            self.interrupted = interrupted

    def plan_periods_again(self) -> None:
        """Asks every hook's periods again, from the iteration being run on.

        For a hook whose period changes during training: a
        :class:`~treadle.hooks.PreemptionHandler` on one process is due at
        no iteration until its signal comes, then at every one (its signal
        handler calls this), so that reading its flag costs the loop nothing
        per iteration. Outside the loop it does nothing: the loop asks the
        periods when it starts."""
        if self._loop_started is not None:
            self._table.plan_periods(self.iter, self.max_iter)

    @property
    def last_run_iter(self) -> int:
        """The last iteration whose step ran (what a checkpoint records); -1 before any."""
        return self._last_run_iter

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the last :meth:`train` stopped early, or ``None``."""
        return self._stop_reason

    # ------------------------------------------------------------------ loop
    def train(self, start_iter: int, max_iter: int) -> None:
        """Runs iterations ``start_iter .. max_iter - 1``.

        An exception is logged with the iteration it happened at, ``after_train``
        runs, and the exception is re-raised.
        """
        # A run stopped after its last iteration but before its end (a
        # preemption) still has its after_train to run.
        finishing = start_iter >= max_iter and self.has_work(start_iter, max_iter)
        if start_iter >= max_iter and not finishing:
            logger.warning(
                "Nothing to train: the run starts at iteration %d and max_iter is %d, so it has "
                "finished already. Raise max_iter to train further.",
                start_iter,
                max_iter,
            )
            self.iter = self.start_iter = start_iter
            self.max_iter = max_iter
            return
        # What default_setup left for this moment (config.yaml, log.txt).
        training_starts()
        self._log_start(start_iter, max_iter, finishing)
        self._reset(start_iter, max_iter)
        with EventStorage(start_iter, nonfinite_check=self.nonfinite_check, history_length=self.history_length) as self.storage:
            if self._restored_storage:
                self.storage.restore_recent(self._restored_storage)
            self._restored_storage = None
            if comm.get_world_size() > 1:
                # Scalars are averaged over ranks at each flush (one collective).
                self.storage.reducer = reduce_across_ranks
            try:
                self.before_train()
                if finishing:
                    self.iter = max_iter
                else:
                    # The loop and each step in one frame-stack chunk, however
                    # deep train() was called from (see treadle.utils.frame_stack).
                    call_with_frame_room(self._run_iterations, start_iter, max_iter)
                    # Like detectron2: after_train sees the first iteration not run.
                    self.iter += 1
            except (Exception, KeyboardInterrupt, SystemExit) as e:
                # Ctrl-C and an exit (a second preemption signal) too: the
                # hooks' after_train still runs (writers flush and close).
                self._after_failed_training(e)
                raise
            else:
                self.finished = not self.interrupted
                self.after_train()
            finally:
                log_time_table(self.timings(), self.iter - self.start_iter)

    def _run_iterations(self, start_iter: int, max_iter: int) -> None:
        """The iterations of :meth:`train`: each one's hooks, step and hooks."""
        clock = time.perf_counter
        self._table.plan_periods(start_iter, max_iter)  # every before_train has run: periods are known
        epoch_length = self.epoch_length
        # after_iteration is called where a hook has it (one registered in training too) or the
        # trainer overrides it: a call less an iteration otherwise.
        own_iteration_end = type(self).after_iteration is not TrainerBase.after_iteration
        iteration_hooks = self._table.after_iteration_schedule
        if epoch_length and start_iter % epoch_length:
            # A resume inside an epoch: its before_epoch ran in the interrupted
            # run, so the index is set here, as that run had it at this iteration.
            self.epoch = start_iter // epoch_length
        self._loop_started = clock()
        try:
            for it in range(start_iter, max_iter):
                self.iter = self.storage.iter = it
                self.iter_start_time = clock()
                if epoch_length and it % epoch_length == 0:
                    self.epoch = it // epoch_length
                    self.before_epoch()
                self.before_step()
                self.run_step()
                self.step_end_time = clock()
                self.after_step()
                if epoch_length and self._ends_epoch(it, epoch_length):
                    self.epoch = it // epoch_length
                    self.after_epoch()
                if own_iteration_end or iteration_hooks.calls:
                    self.after_iteration()
                if self._stop_reason is not None:
                    break
        finally:
            self._loop_seconds = clock() - self._loop_started
            self._loop_started = None
            self._loop_hook_seconds = self._iteration_hook_seconds()
            self._table.forget_plan()

    def _log_start(self, start_iter: int, max_iter: int, finishing: bool) -> None:
        if finishing:
            logger.info(
                "The run stopped after its last iteration (%d) before it finished: running the end of "
                "training (final evaluation and checkpoint).",
                max_iter - 1,
            )
            return
        logger.info("Starting training from iteration %d", start_iter)
        if self._loaded_max_iter is not None and self._loaded_max_iter != max_iter and start_iter > 0:
            logger.warning(
                "Resuming a run of max_iter=%d with max_iter=%d: a schedule over the whole run (an fvcore "
                "multiplier is a function of iteration / max_iter) changes from here on.",
                self._loaded_max_iter,
                max_iter,
            )

    def _reset(self, start_iter: int, max_iter: int) -> None:
        """Forgets what an earlier :meth:`train` left."""
        self.iter = self.start_iter = start_iter
        self._last_run_iter = start_iter - 1
        self.max_iter = max_iter
        self._stop_reason = None
        self.interrupted = self.finished = False
        self.training_error = None
        self._table.seconds.clear()
        self._loop_seconds = None
        self._loop_hook_seconds = 0.0

    def _after_failed_training(self, error: BaseException) -> None:
        note_origin(error, None, self.iter)
        if isinstance(error, SystemExit):
            logger.warning("Exiting with status %s at iteration %d.", error.code, self.iter)
        else:
            # One line on the console, the traceback in log.txt (see setup_logger).
            logger.exception("Exception during training at iteration %d:", self.iter)
        self.training_error = error
        # Other ranks may be inside a collective this rank will never
        # join: no more collectives here; the launcher ends them.
        self.storage.reducer = None
        self._after_train_after_error()

    def has_work(self, start_iter: int, max_iter: int) -> bool:
        """Whether :meth:`train` would run anything: iterations, or the end of a
        run that stopped after its last iteration without finishing."""
        return start_iter < max_iter or (start_iter == max_iter and self._loaded_finished is False)

    def run_step(self) -> None:
        """Runs one iteration through the step object."""
        self.step.run_step()
        self._last_run_iter = self.iter
        if self.nonfinite_check == "step":
            self.storage.materialize()

    # ------------------------------------------------------------------ hook stages
    def before_train(self) -> None:
        """Runs every hook's ``before_train``."""
        self._table.run(self._table.calls["before_train"], self.iter)

    def before_epoch(self) -> None:
        """Runs every hook's ``before_epoch``; ``epoch`` is the index of the
        epoch that begins. Called by the loop before the ``before_step`` of
        an epoch's first iteration (not for an epoch a resumed run starts
        inside), whatever hooks are registered, so a trainer's override runs too."""
        self._table.run(self._table.calls["before_epoch"], self.iter)

    def before_step(self) -> None:
        """Runs every hook's ``before_step``; ``storage.iter`` is already ``iter``."""
        self._table.run(self._table.calls["before_step"], self.iter)

    def after_backward(self) -> None:
        """Runs every hook's ``after_backward``; the step object calls it between
        backward and the optimizer step."""
        self._table.run(self._table.calls["after_backward"], self.iter)

    def after_step(self) -> None:
        """Runs the ``after_step`` of the hooks due at this iteration (see
        :meth:`HookBase.after_step_period`); outside training, every hook's."""
        calls = self._table.after_step_schedule.due(self.iter)
        if calls:  # most iterations of periodic hooks have none due
            self._table.run(calls, self.iter)

    def after_epoch(self) -> None:
        """Runs every hook's ``after_epoch``; ``epoch`` is the index of the
        epoch that ended. Called by the loop after every hook's ``after_step``
        of an epoch's last iteration (see :meth:`_ends_epoch`), whatever
        hooks are registered, so a trainer's override runs too."""
        self._table.run(self._table.calls["after_epoch"], self.iter)

    def _ends_epoch(self, iteration: int, epoch_length: int) -> bool:
        """Whether ``iteration`` ends an epoch: the epoch's last one, the
        run's last one (a run may end inside an epoch), or one after which a
        stop was requested that ends the run rather than pausing it (early
        stopping: the epoch ends with the part of it that ran). A preemption
        leaves its epoch to the resumed run."""
        return (
            (iteration + 1) % epoch_length == 0
            or iteration + 1 == self.max_iter
            or (self._stop_reason is not None and not self.interrupted)
        )

    def after_iteration(self) -> None:
        """Runs the ``after_iteration`` of the hooks due at this iteration (see
        :meth:`HookBase.after_iteration_period`), once every hook's
        ``after_step`` and ``after_epoch`` of it has run."""
        calls = self._table.after_iteration_schedule.due(self.iter)
        if calls:
            self._table.run(calls, self.iter)

    def after_train(self) -> None:
        """Runs every hook's ``after_train``, also when one of them raises.

        The first exception propagates once all have run; later ones are
        logged. A hook may end the process here (``PreemptionHandler`` raises
        ``SystemExit``): the hooks after it must still flush and close files.
        """
        self.storage.iter = self.iter
        self.storage.loop_ended = True
        first: Optional[BaseException] = None
        for call in self._table.calls["after_train"]:
            t0 = time.perf_counter()
            try:
                call.method()
            except BaseException as e:  # SystemExit too: see the docstring
                if first is not None:
                    logger.exception("%s failed after an earlier after_train raised:", call.key)
                    continue
                first = e
                note_origin(e, f"hook {call.key}", self.iter)
            self._table.seconds[call.key] += time.perf_counter() - t0
        if first is not None:
            raise first

    def _after_train_after_error(self) -> None:
        """Runs every after_train while an exception propagates.

        One failing hook must not stop the others (a checkpointer or writer
        further down the list still gets to save), and must not replace the
        original exception, which is the one the user needs to see.
        """
        self.storage.iter = self.iter
        for call in self._table.calls["after_train"]:
            try:
                call.method()
            except BaseException:  # SystemExit too: the original error must win
                logger.exception("%s failed while handling an earlier error:", call.key)

    # ------------------------------------------------------------------ time
    def timings(self) -> Dict[str, float]:
        """Seconds spent so far in the step (``"step"``) and in each ``Hook.stage``.

        The step's share is the time of the iteration loop less that of the
        hooks it called, so the loop's own bookkeeping (well under a
        microsecond per iteration) counts as step time: timing the step
        separately would cost more than that.
        """
        timings = dict(self._table.seconds)
        loop_seconds, in_hooks = self._loop_seconds, self._loop_hook_seconds
        if self._loop_started is not None:  # asked during training
            loop_seconds = time.perf_counter() - self._loop_started
            in_hooks = self._iteration_hook_seconds()
        if loop_seconds is not None:
            timings["step"] = max(loop_seconds - in_hooks, 0.0)
        return timings

    def _iteration_hook_seconds(self) -> float:
        return sum(t for key, t in self._table.seconds.items() if key.rpartition(".")[2] in _ITERATION_STAGES)

    # ------------------------------------------------------------------ state
    def hook_state_keys(self) -> Dict[str, HookBase]:
        """``{key: hook}`` for the hooks in checkpoints.

        The key is the class name, with ``#2``, ``#3``, ... for the second and
        later hooks of one class, so two ``EvalHook`` hooks keep separate states.
        """
        return hook_state_keys(self._table.hooks)

    def state_dict(self) -> Dict[str, Any]:
        """The last iteration run, hook states, step state (data position, grad
        scaler) and RNG states (of every rank, when there are several, and the
        step state of every rank when the ranks' differ: then every rank must
        call this at the same point). Resuming continues at ``iteration + 1``.
        The first one of a step whose data position no checkpoint keeps says
        so in one line (:func:`~treadle.engine.steps.unknown_data_position`)."""
        if self._step is not None and self._step is not self._data_position_checked:
            self._data_position_checked = self._step
            why = unknown_data_position(self._step)
            if why is not None:
                logger.warning(why)
        return capture_state(
            last_run_iter=self._last_run_iter, finished=self.finished, max_iter=self.max_iter,
            hooks=self._table.hooks, step=self._step, storage=getattr(self, "storage", None),
        )

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Puts the trainer back where ``state`` (:meth:`state_dict`) says:
        each rank takes its own step and random states when the checkpoint
        has one per rank of this world size.

        Raises:
            ResumeRefusedError: the ranks' step states differ and the
                checkpoint was saved by another number of processes; nothing
                of the trainer is loaded.
        """
        step_state = step_state_of_this_rank(state)  # first: a refused resume changes nothing
        self.iter = self._last_run_iter = int(state["iteration"])
        self._restored_storage = state.get("storage")
        finished = state.get("finished")
        self._loaded_finished = bool(finished) if finished is not None else None
        self._loaded_max_iter = state.get("max_iter")
        restore_hook_states(self._table.hooks, state.get("hooks", {}))
        if step_state is not None:
            self.step.load_state_dict(step_state)
        restore_rng(state)


def _offers_what_hooks_use(trainer: TrainerBase) -> TrainerProtocol:
    """Never called: mypy checks here that a TrainerBase is what a hook's
    ``self.trainer`` promises (:class:`~treadle.hooks.base.TrainerProtocol`)."""
    return trainer
