"""The iteration loop: hooks around a swappable step object."""

from __future__ import annotations

import logging
import time
import weakref
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from tabulate import tabulate

from treadle.events import EventStorage
from treadle.events.distributed import reduce_across_ranks
from treadle.hooks.base import HOOK_STAGES, HookBase
from treadle.utils import comm
from treadle.utils.frame_stack import call_with_frame_room
from treadle.utils.rng import get_rng_state, set_rng_state
from treadle.utils.run_start import training_starts

from .steps import StepBase

__all__ = ["TrainerBase", "HookOrderError"]

logger = logging.getLogger(__name__)


# An iteration no training reaches.
_NEVER = 2**62


class HookOrderError(ValueError):
    """Hooks were registered in an order that would make one of them mis-run."""


# The stages called inside the iteration loop.
_ITERATION_STAGES = ("before_step", "after_backward", "after_step", "after_epoch")


def _stage_caller(stage: str, doc: str, due_attribute: Optional[str] = None) -> Callable[["TrainerBase"], None]:
    """A method that calls every hook's ``stage`` and times each call.

    One function per stage, made here, rather than a shared helper called with
    the stage's name: this runs several times per iteration, right after the
    step has evicted the interpreter from the CPU caches, and a call less is
    measurable on a millisecond step. ``due_attribute``: the trainer's
    attribute that holds the hooks due now, when not all of the stage's are
    (``after_step``, see :meth:`HookBase.after_step_period`).
    """

    def call_hooks(self: "TrainerBase") -> None:
        hooks = getattr(self, due_attribute) if due_attribute else self._hooks_by_stage[stage]
        if not hooks:
            return
        timings = self._timings
        clock = time.perf_counter
        # One clock read per hook: each hook's end is the next one's start.
        start = clock()
        for _, method, key in hooks:
            try:
                method()
            except (Exception, KeyboardInterrupt) as e:
                _note_failing_hook(e, key, self.iter)
                raise
            end = clock()
            timings[key] += end - start
            start = end

    call_hooks.__name__ = call_hooks.__qualname__ = stage
    call_hooks.__doc__ = doc
    return call_hooks


def _note_failing_hook(error: BaseException, key: str, iteration: int) -> None:
    _note_origin(error, f"hook {key} at iteration {iteration}")


def _note_origin(error: BaseException, where: str) -> None:
    """Records where in the loop ``error`` was raised, once (the innermost place wins).

    Kept as ``error.treadle_origin`` for one-line reports (``tools/train_net.py``
    prints it), and as a note that Python shows under the traceback.
    """
    if getattr(error, "treadle_origin", None):
        return
    try:
        error.treadle_origin = where  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__
        return
    if hasattr(error, "add_note"):  # Python >= 3.11
        error.add_note(f"treadle: raised by {where}")


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
        storage: the :class:`EventStorage` opened by :meth:`train`.
        nonfinite_check: passed to the ``EventStorage``: ``"flush"``, ``"step"`` or ``"off"``.
        history_length: values the ``EventStorage`` keeps per scalar name.
        epoch_length: iterations per epoch when the data has a length (set by
            whoever builds the trainer); hooks with periods in epochs and
            ``after_epoch`` need it.
        epoch: during ``after_epoch``, the 0-based index of the epoch that ended.
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
        self._hooks: List[HookBase] = []
        self._hooks_by_stage: Dict[str, List[Any]] = {s: [] for s in HOOK_STAGES}
        self._before_step_hooks: List[Any] = []
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
        self.training_error: Optional[BaseException] = None
        self.interrupted = False
        self.finished = False
        # The index of the epoch whose after_epoch runs (see HookBase).
        self.epoch: Optional[int] = None
        self._epochs_done_through = -1
        # Whether the checkpoint loaded into this trainer was of a finished
        # run; None when nothing was loaded or the checkpoint predates the flag.
        self._loaded_finished: Optional[bool] = None
        self._loaded_max_iter: Optional[int] = None
        self.iter_start_time = 0.0
        self.step_end_time = 0.0
        self._iteration_times: Optional[List[Tuple[float, int]]] = None
        self._iteration_times_from = 0
        # (points, read) pairs a hook asked for (record_every_iteration).
        self._every_iteration_reads: List[Tuple[List[Tuple[Any, int]], Callable[[], Any]]] = []
        # Seconds of the iterations timed for time_iterations, in the last train().
        self.timed_iteration_seconds = 0.0
        self._timings: Dict[str, float] = defaultdict(float)
        # The after_step schedule (see _plan_after_step): the hooks called at
        # every iteration, all of them, the iteration where a periodic one is
        # next due, and the hooks whose after_step runs now.
        self._after_step_always: List[Any] = []
        self._after_step_next_due = 0
        self._after_step_periods: Dict[int, int] = {}
        self._after_step_now: List[Any] = []
        # Work hooks asked to run when the current iteration ends (at_iteration_end).
        self._boundary: List[Any] = []
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
        step.trainer = weakref.proxy(self)
        self._step = step
        self._tell_step_about_hooks()

    @property
    def hooks(self) -> List[HookBase]:
        return list(self._hooks)

    def register_hooks(self, hooks: Sequence[Optional[HookBase]]) -> None:
        """Appends hooks; ``None`` entries are skipped; list order is call order.

        Raises:
            TypeError: an entry is not a :class:`HookBase`.
            HookOrderError: a hook would run before a hook it must follow
                (see :attr:`HookBase.runs_after`).
        """
        hooks = [h for h in hooks if h is not None]
        for h in hooks:
            if not isinstance(h, HookBase):
                raise TypeError(f"Hooks must be HookBase instances, got {type(h).__name__}: {h!r}")
        candidate = self._hooks + hooks
        _check_hook_order(candidate)
        for h in hooks:
            # A proxy, not a reference: the trainer holds its hooks, and a
            # cycle would keep both alive after the trainer is dropped.
            h.trainer = weakref.proxy(self)
        self._hooks = candidate
        # Bound methods and timing keys made once: the loop calls them every step.
        self._hooks_by_stage = {
            stage: [(h, getattr(h, stage), f"{type(h).__name__}.{stage}") for h in self._hooks if h.overrides(stage)]
            for stage in HOOK_STAGES
        }
        self._before_step_hooks = self._hooks_by_stage["before_step"]
        self._tell_step_about_hooks()
        self._plan_after_step()

    def _plan_after_step(self, *, ask_periods: bool = False) -> None:
        """Which hooks' ``after_step`` runs at which iterations.

        With ``ask_periods`` (when training starts, after ``before_train``)
        each hook's :meth:`~HookBase.after_step_period` is asked; otherwise
        the periods already known are kept, and a hook registered since is
        called every iteration.
        """
        entries = self._hooks_by_stage["after_step"]
        periods = {}
        for hook, _, _ in entries:
            period = hook._after_step_schedule() if ask_periods else self._after_step_periods.get(id(hook))
            if period is not None:
                periods[id(hook)] = max(int(period), 0)
        self._after_step_periods = periods
        self._after_step_always = [entry for entry in entries if id(entry[0]) not in periods]
        self._after_step_now = self._after_step_always if self._loop_started is not None else entries
        self._after_step_next_due = self._next_after_step_due(self.iter - 1 if ask_periods else self.iter)

    def _next_after_step_due(self, after: int) -> int:
        """The first iteration after ``after`` where a periodic hook's after_step is due."""
        if not self._after_step_periods:
            return _NEVER
        due = self.max_iter - 1 if self.max_iter - 1 > after else _NEVER
        for period in self._after_step_periods.values():
            if period > 0:
                due = min(due, ((after + 1) // period + 1) * period - 1)
        return due

    def _tell_step_about_hooks(self) -> None:
        """Lets the step skip ``after_backward`` when nothing would run there."""
        if self._step is not None:
            self._step.calls_after_backward = bool(self._hooks_by_stage["after_backward"]) or (
                type(self).after_backward is not TrainerBase.after_backward
            )

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
        finishing = False
        if start_iter >= max_iter:
            if self.has_work(start_iter, max_iter):
                # Stopped after its last iteration but before its end (a
                # preemption): what after_train does is still to be done.
                finishing = True
                training_starts()
                logger.info(
                    "The run stopped after its last iteration (%d) before it finished: running the end of "
                    "training (final evaluation and checkpoint).",
                    max_iter - 1,
                )
            else:
                logger.warning(
                    "Nothing to train: the run starts at iteration %d and max_iter is %d, so it has "
                    "finished already. Raise max_iter to train further.",
                    start_iter,
                    max_iter,
                )
                self.iter = self.start_iter = start_iter
                self.max_iter = max_iter
                return
        else:
            # What default_setup left for this moment (config.yaml, log.txt).
            training_starts()
            logger.info("Starting training from iteration %d", start_iter)
            if self._loaded_max_iter is not None and self._loaded_max_iter != max_iter and start_iter > 0:
                logger.warning(
                    "Resuming a run of max_iter=%d with max_iter=%d: a schedule over the whole run (an fvcore "
                    "multiplier is a function of iteration / max_iter) changes from here on.",
                    self._loaded_max_iter,
                    max_iter,
                )
        self.iter = self.start_iter = start_iter
        self._last_run_iter = start_iter - 1
        self.max_iter = max_iter
        self._stop_reason = None
        self.interrupted = False
        self.finished = False
        self.training_error = None
        self._epochs_done_through = start_iter - 1
        self._boundary = []
        self._iteration_times = None
        self._every_iteration_reads = []
        self.timed_iteration_seconds = 0.0
        self._timings = defaultdict(float)
        self._loop_seconds = None
        self._loop_hook_seconds = 0.0
        with EventStorage(
            start_iter, nonfinite_check=self.nonfinite_check, history_length=self.history_length
        ) as self.storage:
            restored, self._restored_storage = getattr(self, "_restored_storage", None), None
            if restored:
                self.storage.restore_recent(restored)
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
                # hooks' after_train still runs (writers flush and close), as
                # for an error; then it propagates.
                _note_origin(e, f"iteration {self.iter}")
                if isinstance(e, SystemExit):
                    logger.warning("Exiting with status %s at iteration %d.", e.code, self.iter)
                else:
                    # One line on the console, the traceback in log.txt (see setup_logger).
                    logger.exception("Exception during training at iteration %d:", self.iter)
                self.training_error = e
                # Other ranks may be inside a collective this rank will never
                # join: no more collectives here; the launcher ends them.
                self.storage.reducer = None
                self._after_train_after_error()
                raise
            else:
                self.finished = not self.interrupted
                self.after_train()
            finally:
                self._log_timing_table()

    def _run_iterations(self, start_iter: int, max_iter: int) -> None:
        storage = self.storage
        clock = time.perf_counter
        # A subclass's before_step runs every iteration; the stage caller
        # only when a hook needs it (it is empty with the default hooks).
        before_step_overridden = type(self).before_step is not TrainerBase.before_step
        after_step_overridden = type(self).after_step is not TrainerBase.after_step
        # Periods are known now, after every before_train.
        self._plan_after_step(ask_periods=True)
        # Epoch ends are looked for only when a hook wants them.
        epoch_length = self.epoch_length if self._hooks_by_stage["after_epoch"] else None
        # The step object is called from here, without TrainerBase.run_step's
        # frame in between, unless a subclass has its own run_step.
        direct_step = type(self).run_step is TrainerBase.run_step
        if direct_step:
            self.step  # noqa: B018 - raises the clear error when no step was assigned
        check_each_step = self.nonfinite_check == "step"
        # The series of iteration times a hook asked for (time_iterations).
        times, times_from = self._iteration_times, self._iteration_times_from
        reads = self._every_iteration_reads
        timed = 0.0
        self._loop_started = clock()
        # In the loop, after_step runs the hooks called every iteration, and
        # all of them where a periodic one is due.
        self._after_step_now = self._after_step_always
        try:
            for it in range(start_iter, max_iter):
                # Hooks may read storage.iter; keep it in step with self.iter.
                self.iter = storage.iter = it
                self.iter_start_time = start = clock()
                # Read each iteration: hooks may be registered during training.
                if before_step_overridden or self._before_step_hooks:
                    self.before_step()
                if direct_step:
                    # Read each iteration: a hook may assign another step.
                    self._step.run_step()  # type: ignore[union-attr]
                    self._last_run_iter = it
                    if check_each_step:
                        storage.materialize()
                else:
                    self.run_step()
                self.step_end_time = end = clock()
                if times is not None and it >= times_from:
                    times.append((end - start, it))
                    timed += end - start
                if reads:
                    for points, read in reads:
                        points.append((read(), it))
                if it >= self._after_step_next_due:
                    # A periodic hook is due: every hook runs, in order.
                    self._after_step_now = self._hooks_by_stage["after_step"]
                    self._after_step_next_due = self._next_after_step_due(it)
                    try:
                        self.after_step()
                    finally:
                        self._after_step_now = self._after_step_always
                elif after_step_overridden or self._after_step_always:
                    self.after_step()
                # The run's last epoch ends in after_train, after the final evaluation.
                if epoch_length and (it + 1) % epoch_length == 0 and it + 1 != max_iter:
                    self.epoch = it // epoch_length
                    self.after_epoch()
                    self._epochs_done_through = self.iter
                if self._boundary:
                    self._run_boundary()
                if self._stop_reason is not None:
                    break
        finally:
            self._loop_seconds = clock() - self._loop_started
            self._loop_started = None
            # The hooks the loop ran: the last epoch's after_epoch, which
            # after_train runs, is not in the loop's time.
            self._loop_hook_seconds = self._iteration_hook_seconds()
            self._after_step_now = self._hooks_by_stage["after_step"]
            self.timed_iteration_seconds = timed

    def time_iterations(self, points: List[Tuple[float, int]], from_iter: int) -> None:
        """Has the loop append ``(seconds, iteration)`` to ``points`` for every
        iteration from ``from_iter`` on, in this training: the time from
        :attr:`iter_start_time` to :attr:`step_end_time`, the sum of them in
        :attr:`timed_iteration_seconds`. Call it in ``before_train``
        (:class:`~treadle.hooks.IterationTimer` passes the storage's ``time``
        series): the loop does it with the clock reads it makes anyway, where
        a hook would cost a call every iteration."""
        self._iteration_times = points
        self._iteration_times_from = from_iter

    def record_every_iteration(self, points: List[Tuple[Any, int]], read: Callable[[], Any]) -> None:
        """Has the loop append ``(read(), iteration)`` to ``points`` after
        every iteration's step, before any hook's ``after_step``, in this
        training. Call it in ``before_train``
        (:class:`~treadle.hooks.LRMonitor` passes the storage's ``lr``
        series and a read of the rate): for a value a hook would otherwise
        publish from ``after_step`` at every iteration, where the hook's call
        is most of the cost on a fast step. ``read`` takes no argument; one
        made of C functions (``functools.partial(operator.getitem, group,
        "lr")``) runs no Python frame. An exception from it fails the
        iteration, as a failing step does."""
        self._every_iteration_reads.append((points, read))

    def at_iteration_end(self, task: Callable[[], None], key: str) -> None:
        """Runs ``task()`` once, when the current iteration ends: after every
        hook's ``after_step`` (and ``after_epoch``) of the iteration, before
        the next one starts. For work that needs the state every hook leaves,
        whatever order the hooks were registered in: a checkpoint taken there
        holds each hook's finished state (``PeriodicCheckpointer`` and
        ``PreemptionHandler`` use it). ``key`` is where its time is counted
        (``"Hook.after_step"``) and what an error names. Tasks run in the
        order they were asked for; a failed iteration runs none.
        """
        self._boundary.append((task, key))

    def _run_boundary(self) -> None:
        tasks, self._boundary = self._boundary, []
        timings = self._timings
        for task, key in tasks:
            start = time.perf_counter()
            try:
                task()
            except (Exception, KeyboardInterrupt) as e:
                _note_failing_hook(e, key, self.iter)
                raise
            timings[key] += time.perf_counter() - start

    def has_work(self, start_iter: int, max_iter: int) -> bool:
        """Whether :meth:`train` would run anything: iterations, or the end of a
        run that stopped after its last iteration without finishing."""
        return start_iter < max_iter or (start_iter == max_iter and self._loaded_finished is False)

    def run_step(self) -> None:
        """Runs one iteration through the step object."""
        step = self._step
        if step is None:
            raise RuntimeError("The trainer has no step object: assign one with `trainer.step = ...`.")
        step.run_step()
        self._last_run_iter = self.iter
        if self.nonfinite_check == "step":
            self.storage.materialize()

    before_train = _stage_caller("before_train", "Runs every hook's ``before_train``.")

    def after_train(self) -> None:
        """Runs every hook's ``after_train``, also when one of them raises.

        The first exception propagates once all have run; later ones are
        logged. A hook may end the process here (``PreemptionHandler`` raises
        ``SystemExit``): the hooks after it must still flush and close files.
        """
        self.storage.iter = self.iter
        first: Optional[BaseException] = None
        calls = self._hooks_by_stage["after_train"]
        if self._epoch_pending():
            # The epoch that ends with training: each hook's after_epoch just
            # before its after_train, so later hooks see the final evaluation.
            self.epoch = (self.iter - 1) // self.epoch_length
            self._epochs_done_through = self.iter - 1
            order = {id(h): i for i, h in enumerate(self._hooks)}
            calls = sorted(
                self._hooks_by_stage["after_epoch"] + calls,
                key=lambda entry: (order[id(entry[0])], entry[2].endswith(".after_train")),
            )
        for _, method, key in calls:
            t0 = time.perf_counter()
            try:
                method()
            except BaseException as e:  # SystemExit too: see the docstring
                if first is not None:
                    logger.exception("%s failed after an earlier after_train raised:", key)
                    continue
                first = e
                _note_failing_hook(e, key, self.iter)
            self._timings[key] += time.perf_counter() - t0
        if first is not None:
            raise first

    def _epoch_pending(self) -> bool:
        """Whether training ended (not failed, not interrupted) inside or at the
        end of an epoch whose ``after_epoch`` has not run."""
        return bool(
            self.epoch_length
            and self._hooks_by_stage["after_epoch"]
            and self.training_error is None
            and not self.interrupted
            and self.iter - 1 > self._epochs_done_through
            and self.iter > self.start_iter
        )

    before_step = _stage_caller("before_step", "Runs every hook's ``before_step``; ``storage.iter`` is already ``iter``.")
    after_epoch = _stage_caller("after_epoch", "Runs every hook's ``after_epoch``; ``epoch`` is the index of the epoch that ended.")
    after_backward = _stage_caller(
        "after_backward", "Runs every hook's ``after_backward``; the step object calls it between backward and the optimizer step."
    )
    after_step = _stage_caller(
        "after_step",
        "Runs the ``after_step`` of the hooks due at this iteration: all of them, but for periodic "
        "hooks between their periods (see :meth:`HookBase.after_step_period`).",
        due_attribute="_after_step_now",
    )

    def _after_train_after_error(self) -> None:
        """Runs every after_train while an exception propagates.

        One failing hook must not stop the others (a checkpointer or writer
        further down the list still gets to save), and must not replace the
        original exception, which is the one the user needs to see.
        """
        self.storage.iter = self.iter
        for _, method, key in self._hooks_by_stage["after_train"]:
            try:
                method()
            except BaseException:  # SystemExit too: the original error must win
                logger.exception("%s failed while handling an earlier error:", key)

    def _log_timing_table(self) -> None:
        """The step and the hook stages that took at least 1% of the time (INFO),
        and every row, the near-zero ones included (DEBUG)."""
        iters = max(self.iter - self.start_iter, 1)
        rows = sorted(self.timings().items(), key=lambda kv: -kv[1])
        if not rows:
            return
        total = sum(t for _, t in rows) or 1.0

        def table(selected: List[Tuple[str, float]]) -> str:
            return tabulate(
                [(name, f"{t:.4f}", f"{1000 * t / iters:.4f}", f"{100 * t / total:.1f}%") for name, t in selected],
                headers=["where", "total (s)", "per iteration (ms)", "share"],
                tablefmt="pipe",
            )

        shown = [(name, t) for name, t in rows if name == "step" or t >= 0.01 * total]
        hidden = [(name, t) for name, t in rows if (name, t) not in shown]
        rest = ""
        if hidden:
            rest = (
                f"\n({len(hidden)} other hook stages took {sum(t for _, t in hidden):.4f} s in all, under 1% each; "
                "the full table is logged at DEBUG level)"
            )
        logger.info("Time spent in the step and in the hooks over %d iterations:\n%s%s", iters, table(shown), rest)
        if hidden and logger.isEnabledFor(logging.DEBUG):
            logger.debug("Time spent in the step and in every hook stage:\n%s", table(rows))

    def timings(self) -> Dict[str, float]:
        """Seconds spent so far in the step (``"step"``) and in each ``Hook.stage``.

        The step's share is the time of the iteration loop less that of the
        hooks it called, so the loop's own bookkeeping (well under a
        microsecond per iteration) counts as step time: timing the step
        separately would cost more than that.
        """
        timings = dict(self._timings)
        loop_seconds, in_hooks = self._loop_seconds, self._loop_hook_seconds
        if self._loop_started is not None:  # asked during training
            loop_seconds = time.perf_counter() - self._loop_started
            in_hooks = self._iteration_hook_seconds()
        if loop_seconds is not None:
            timings["step"] = max(loop_seconds - in_hooks, 0.0)
        return timings

    def _iteration_hook_seconds(self) -> float:
        return sum(t for key, t in self._timings.items() if key.rpartition(".")[2] in _ITERATION_STAGES)

    # ------------------------------------------------------------------ state
    def hook_state_keys(self) -> Dict[str, HookBase]:
        """``{key: hook}`` for the hooks in checkpoints.

        The key is the class name, with ``#2``, ``#3``, ... for the second and
        later hooks of one class, so two ``EvalHook``s keep separate states.
        """
        keys: Dict[str, HookBase] = {}
        seen: Dict[str, int] = defaultdict(int)
        for h in self._hooks:
            name = type(h).__qualname__
            seen[name] += 1
            keys[name if seen[name] == 1 else f"{name}#{seen[name]}"] = h
        return keys

    def state_dict(self) -> Dict[str, Any]:
        """The last iteration run, hook states, step state (data position, grad
        scaler) and RNG states (of every rank, when there are several: then
        every rank must call this at the same point). Resuming continues at
        ``iteration + 1``."""
        rng = get_rng_state()
        state: Dict[str, Any] = {
            "iteration": self._last_run_iter,
            "rng": rng,
            "finished": self.finished,
            "max_iter": self.max_iter,
        }
        if comm.get_world_size() > 1:
            # Each rank draws its own dropout masks: all of them are needed for
            # an exact resume. A collective: every rank calls this together.
            state["rng_per_rank"] = comm.all_gather(rng)
        hooks = {}
        for key, h in self.hook_state_keys().items():
            hook_state = h.state_dict()
            if hook_state:
                hooks[key] = hook_state
        if hooks:
            state["hooks"] = hooks
        if self._step is not None:
            step_state = self._step.state_dict()
            if step_state:
                state["step"] = step_state
        storage = getattr(self, "storage", None)
        if storage is not None:
            # The recent values of every scalar: after a resume, smoothed
            # values (medians over a window) are those of an uninterrupted run.
            state["storage"] = storage.recent_state()
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.iter = self._last_run_iter = int(state["iteration"])
        self._restored_storage = state.get("storage")
        finished = state.get("finished")
        self._loaded_finished = bool(finished) if finished is not None else None
        self._loaded_max_iter = state.get("max_iter")
        keyed = self.hook_state_keys()
        for key, hook_state in state.get("hooks", {}).items():
            if key in keyed:
                keyed[key].load_state_dict(hook_state)
            else:
                logger.warning("Checkpoint has a state for hook '%s', which is not registered; ignored.", key)
        if "step" in state:
            self.step.load_state_dict(state["step"])
        per_rank = state.get("rng_per_rank")
        if per_rank is not None and len(per_rank) == comm.get_world_size():
            set_rng_state(per_rank[comm.get_rank()])
        elif "rng" in state:
            if per_rank is not None or comm.get_world_size() > 1:
                logger.warning(
                    "The checkpoint's random states are of %d process(es) and this run has %d: every rank "
                    "restarts from rank 0's state, so the resumed run is not bit-identical to an "
                    "uninterrupted one.",
                    len(per_rank) if per_rank is not None else 1,
                    comm.get_world_size(),
                )
            set_rng_state(state["rng"])


def _check_hook_order(hooks: Sequence[HookBase]) -> None:
    for i, h in enumerate(hooks):
        for required in h.runs_after:
            later = [j for j in range(i + 1, len(hooks)) if isinstance(hooks[j], required)]
            if later:
                order = ", ".join(type(x).__name__ for x in hooks)
                reason = h.order_reason or f"it reads what {required.__name__} produces"
                raise HookOrderError(
                    f"{type(h).__name__} must be registered after {required.__name__}: {reason}. "
                    f"Got the order [{order}]."
                )
