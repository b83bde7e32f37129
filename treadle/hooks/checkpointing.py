"""Periodic, final and best checkpoints."""

from __future__ import annotations

import functools

import logging
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from treadle.evaluation.registry import metric_mode

from .base import HookBase
from .early_stopping import is_better, latest_metric, period_start
from .ema import EMA
from .evaluation import EvalHook
from .periods import Period
from .writing import PeriodicWriter

if TYPE_CHECKING:
    from treadle.checkpoint import Checkpointer

__all__ = ["PeriodicCheckpointer", "BestCheckpointer"]

logger = logging.getLogger(__name__)


def trainer_checkpointer(hook: HookBase, given: Optional["Checkpointer"]) -> "Checkpointer":
    if given is not None:
        return given
    checkpointer = getattr(hook.trainer, "checkpointer", None)
    if checkpointer is None:
        raise ValueError(
            f"{type(hook).__name__} was given no checkpointer and the trainer has none (trainer.checkpointer)."
        )
    return checkpointer


def flush_writers(hook: HookBase, *, stop: bool = False) -> None:
    """Flushes every :class:`PeriodicWriter` before a resume point is saved.

    A resumed run starts its writers at the iteration after its checkpoint, so
    a value at or before that iteration which no writer has written when the
    checkpoint reaches the disk is never written if the process then dies
    (kill -9): the metrics of the checkpoint's own iteration when the writer
    is registered after this hook, or an evaluation put between two flushes.
    Written first, a line the checkpoint does not cover is dropped and
    written again by the resumed run instead. ``stop=True``: the run stops
    here to be resumed (see :meth:`PeriodicWriter.flush`).
    """
    for writer in hook.hooks_of(PeriodicWriter):
        writer.flush(stop=stop)


class BestCheckpointer(HookBase):
    """Saves ``model_best`` when ``val_metric`` improves.

    Runs after_step and after_train, after the :class:`EvalHook` that puts
    the metric into storage, and only at iterations where that hook
    evaluated (so it never forces a device sync in between); with
    ``period``, every ``period`` iterations and at the end instead, with no
    evaluation needed: for a training scalar (``total_loss``), read as its
    value over the period's iterations (its mean: an epoch's is the one the
    plain ``Trainer``'s history shows), not its last iteration's. NaN values are
    ignored. The best value and its iteration are kept in the trainer's
    state, so they survive a resume. Saving ``model_best`` does not move the
    ``last_checkpoint`` pointer used for resuming.

    ``model_best`` holds the weights that were scored: when evaluation runs
    on an :class:`EMA` average (``eval_with_ema``), its ``"model"`` entry is
    the averaged weights, so ``--eval-only`` on it reproduces the recorded
    best (the file's ``"weights"`` entry says ``"ema"``).

    The signature is detectron2's. ``mode`` None infers the direction from
    the metric (:func:`~treadle.evaluation.metric_mode`: ``"min"`` for
    losses, errors, ``cer``, ``wer``, ``perplexity``...; ``"max"`` for
    accuracy-like metrics and any metric registered as higher-is-better).

    Args:
        eval_period: detectron2's period of the check. Accepted for ported
            code; treadle checks exactly when an EvalHook evaluated, which is
            what a matching period meant.
        checkpointer: defaults to ``trainer.checkpointer``.
        val_metric: the scalar name, as put by the EvalHook (e.g.
            ``"accuracy"``, or ``"val/accuracy"`` for nested results).
        mode: ``"max"``, ``"min"``, or None to infer it.
        file_prefix: name of the file written.
        period: None: checked where an EvalHook evaluated (one must be
            registered); N: every N iterations and at the end of training,
            a training scalar's mean over those iterations
            (:meth:`~treadle.events.EventStorage.value_over`; an evaluation
            result's latest value).
    """

    runs_after = (EvalHook,)
    order_reason = "it reads the evaluation's result of the same iteration"
    uses = (EMA,)
    state_attributes = ("best_metric", "best_iter")

    def __init__(
        self,
        eval_period: int,
        checkpointer: Optional["Checkpointer"],
        val_metric: str,
        mode: Optional[str] = None,
        file_prefix: str = "model_best",
        *,
        period: Optional[int] = None,
    ) -> None:
        if isinstance(eval_period, str):
            raise TypeError(
                "BestCheckpointer(eval_period, checkpointer, val_metric, mode=None, file_prefix='model_best') "
                f"takes the metric third, as detectron2's does; got {eval_period!r} first"
            )
        if not isinstance(val_metric, str) or not val_metric:
            raise TypeError(f"BestCheckpointer val_metric must be a metric name, got {val_metric!r}")
        if mode is None:
            mode = metric_mode(val_metric)
        elif mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer mode must be 'max', 'min' or None, got {mode!r}")
        self.eval_period = eval_period
        self.metric = val_metric
        self.mode = mode
        self._checkpointer = checkpointer
        self.file_prefix = file_prefix
        self.best_metric: Optional[float] = None
        self.best_iter: Optional[int] = None
        self._period = Period(period) if period is not None else None
        self._eval_hooks: List[EvalHook] = []

    def before_train(self) -> None:
        self._eval_hooks = self.hooks_of(EvalHook)
        if not self._eval_hooks and self._period is None:
            raise ValueError(f"BestCheckpointer('{self.metric}') needs an EvalHook registered before it "
                             "(or period=N to watch a training scalar such as 'total_loss' every N iterations).")
        self._checkpointer = trainer_checkpointer(self, self._checkpointer)
        self._ema = next((h for h in self.hooks_of(EMA) if h.eval_with_ema), None)
        logger.info("BestCheckpointer: saving %s when %s reaches a new %s", self.file_prefix, self.metric,
                    "maximum" if self.mode == "max" else "minimum")

    def _check(self, iteration: int) -> None:
        # With a period, after_step runs at the period only, and after_train at
        # the end: a value equal to the best one checked saves nothing.
        if self._period is None and not any(h.last_eval_iter == self.trainer.iter for h in self._eval_hooks):
            return
        value, metric_iter = latest_metric(self.trainer.storage, self.metric, type(self).__name__,
                                           since=period_start(self._period, iteration))
        if math.isnan(value):
            logger.warning("BestCheckpointer: %s is NaN at iteration %d; ignored.", self.metric, metric_iter)
            return
        if self.best_metric is None or is_better(value, self.best_metric, self.mode, 0.0):
            previous = self.best_metric
            self.best_metric, self.best_iter = value, metric_iter
            # The trainer state saved with model_best carries the new best.
            checkpointer = self._checkpointer
            assert checkpointer is not None  # resolved in before_train
            if self._ema is not None:
                # The weights that were scored: the evaluation ran on the average.
                with self._ema.averaged_weights():
                    if checkpointer.checkpoint_format() == "dcp":
                        checkpointer.save_weights(self.file_prefix, iteration=iteration, weights="ema")
                    else:
                        checkpointer.save(
                            self.file_prefix, iteration=iteration, tag_last_checkpoint=False, asynchronous=False,
                            weights="ema",
                        )
            elif checkpointer.checkpoint_format() == "dcp":
                # The best weights, for evaluation and export: one plain file, weights only.
                checkpointer.save_weights(self.file_prefix, iteration=iteration)
            else:
                checkpointer.save(self.file_prefix, iteration=iteration, tag_last_checkpoint=False, asynchronous=False)
            logger.info(
                "Saved %s: %s = %.6g at iteration %d (previous best: %s)",
                self.file_prefix, self.metric, value, metric_iter, "none" if previous is None else f"{previous:.6g}",
            )

    # With a period, none at the last iteration: after_train checks the end.
    runs_at_last_iteration = False

    def after_step_period(self) -> Optional[int]:
        # Watching evaluations: every iteration, to see where one ran.
        return None if self._period is None else self._period.iterations

    def after_step(self) -> None:
        self._check(self.trainer.iter)

    def after_train(self) -> None:
        if self.trainer.training_error is None:
            # trainer.iter is one past the last iteration run; the checkpoint
            # holds the same state as model_final, and says the same iteration.
            self._check(self.trainer.iter - 1)


class PeriodicCheckpointer(HookBase):
    """Saves ``model_{iter:07d}`` every ``period`` and ``model_final`` at the end.

    Keeps the last ``max_to_keep`` periodic files of this run's lineage: the
    files this run and the runs it resumed from wrote, whose names are kept
    in the hook's state (so the limit holds across restarts). Any other file
    in the folder (copied in, left by another run) is neither counted nor
    deleted. A checkpoint saved before treadle kept the lineage adopts the
    periodic files on disk when resumed. The final checkpoint is written
    after the last iteration and after a stop request (early stopping), not
    after an exception, nor after a preemption that left iterations to run
    (the :class:`PreemptionHandler`'s checkpoint is then the resume point, and
    the run is not finished). Each save is preceded by a flush of the
    :class:`PeriodicWriter` hooks, so that no value at or before the saved
    iteration is lost if the process dies right after the save.

    Any registration order resumes exactly: the periodic checkpoint is taken
    in ``after_iteration``, after every hook's ``after_step`` (and
    ``after_epoch``) of that iteration ran, so it holds each hook's finished
    state (an EMA or a scheduler registered after this hook included). Its
    period declares no save at the run's last iteration
    (:attr:`runs_at_last_iteration`): ``after_train`` writes ``model_final`` then.

    The signature is detectron2's.

    Args:
        checkpointer: defaults to ``trainer.checkpointer``.
        period: iterations (or a :class:`Period`, e.g. ``Period(1, "epoch")``).
        max_iter: detectron2's: the run's length, after which ``model_final``
            is saved. treadle saves ``model_final`` when training ends
            (``trainer.max_iter``); a different value given here is reported
            when training starts.
        max_to_keep: periodic checkpoints kept on disk; None keeps all.
        file_prefix: prefix of the periodic files.
        async_save: write periodic checkpoints in the background (training
            stalls only to copy the state to host memory); ``None`` follows
            the checkpointer's ``async_save``. A background save that fails
            stops training at the next iteration with a
            :class:`~treadle.checkpoint.CheckpointError`; the previous
            checkpoint stays the resume point. The final checkpoint is
            written synchronously, after the one in flight.
        export_safetensors: also write the final weights as
            ``{file_prefix}_final.safetensors`` (for Hugging Face tools).
    """

    # It flushes the writers before each save (see flush_writers).
    uses = (PeriodicWriter,)
    state_attributes = ("lineage",)

    def __init__(
        self,
        checkpointer: Optional["Checkpointer"] = None,
        period: int | Period = 5000,
        max_iter: Optional[int] = None,
        max_to_keep: Optional[int] = None,
        file_prefix: str = "model",
        *,
        async_save: Optional[bool] = None,
        export_safetensors: bool = False,
    ) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        if max_iter is not None and (isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1):
            raise ValueError(f"max_iter must be a positive integer or None, got {max_iter!r}")
        self.max_iter = max_iter
        self._checkpointer = checkpointer
        self._period = period if isinstance(period, Period) else Period(period)
        self.max_to_keep = max_to_keep
        self.file_prefix = file_prefix
        self.async_save = async_save
        self.export_safetensors = bool(export_safetensors)
        # The iteration of the last periodic save of this training, for
        # PreemptionHandler (which does not save the same state twice).
        self.last_saved_iter: Optional[int] = None
        # File names of this run's lineage's periodic checkpoints, oldest first.
        self.lineage: List[str] = []
        self._lineage_known = True
        self._state_loaded = False

    @property
    def checkpointer(self) -> "Checkpointer":
        return trainer_checkpointer(self, self._checkpointer)

    def before_train(self) -> None:
        self._checkpointer = self.checkpointer
        self._period.resolve(self.trainer, "PeriodicCheckpointer")
        self.last_saved_iter = None
        if self.max_iter is not None and self.max_iter != self.trainer.max_iter:
            logger.warning(
                "PeriodicCheckpointer(max_iter=%d), but training ends after %d iterations: model_final is saved "
                "when training ends.",
                self.max_iter,
                self.trainer.max_iter,
            )
        if self.trainer.start_iter > 0 and not self._state_loaded:
            self._lineage_known = False  # resumed from a checkpoint without this hook's state
        self._state_loaded = False

    def state_dict(self) -> Dict[str, Any]:
        return {"lineage": list(self.lineage)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.lineage = list(state.get("lineage", []))
        self._lineage_known = "lineage" in state
        self._state_loaded = True

    def save(self, iteration: int, *, asynchronous: Optional[bool] = None) -> None:
        """Writes the checkpoint of ``iteration`` and prunes old ones of the
        lineage; ``asynchronous`` overrides the hook's ``async_save``."""
        name = f"{self.file_prefix}_{iteration:07d}"
        if not self._lineage_known:
            # Resumed from a checkpoint that predates the lineage: the periodic
            # files on disk up to it are taken as this run's, as they were counted before.
            self.lineage = self.checkpointer.numbered_files(f"{self.file_prefix}_", up_to=iteration)
            self._lineage_known = True
        # Listed before saving: the state inside the file includes the file itself.
        filename = self.checkpointer.filename_for(name)  # .pth or .dcp
        self.lineage = [n for n in self.lineage if n != filename] + [filename]
        prune = None
        if self.max_to_keep is not None:
            # Runs once the new file is written (in the background for an asynchronous save).
            prune = functools.partial(
                self.checkpointer.prune, prefix=f"{self.file_prefix}_", keep_last=self.max_to_keep, only=list(self.lineage)
            )

        asynchronous = self.async_save if asynchronous is None else asynchronous
        self.checkpointer.save(name, iteration=iteration, asynchronous=asynchronous, then=prune)
        self.last_saved_iter = iteration
        if self.max_to_keep is not None:
            self.lineage = self.lineage[-self.max_to_keep :]

    runs_at_last_iteration = False  # after_train writes model_final

    def saves_at(self, iteration: int) -> bool:
        """Whether this hook saves the periodic checkpoint of ``iteration`` in
        its ``after_iteration`` (its period ends there, and it is not the run's
        last: ``model_final`` is written then). Read during training."""
        return self._period.fires_after(iteration) and iteration != self.trainer.max_iter - 1

    def after_step_period(self) -> Optional[int]:
        # An asynchronous save's failure is looked for at every iteration.
        asynchronous = self.async_save if self.async_save is not None else getattr(self._checkpointer, "async_save", True)
        return None if asynchronous else 0

    def after_step(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.raise_if_failed()  # a background save's failure, within one iteration

    def after_iteration_period(self) -> Optional[int]:
        return self._period.iterations

    def after_iteration(self) -> None:
        # Every hook's after_step of the iteration has run: the checkpoint holds their state.
        iteration = self.trainer.iter
        if self.last_saved_iter != iteration:  # a PreemptionHandler registered before may have saved it
            flush_writers(self)
            self.save(iteration)

    def after_train(self) -> None:
        if self.trainer.training_error is not None:
            # Let the save in flight finish (it is a good checkpoint); its own
            # failure must not hide the error that ended training.
            try:
                self.checkpointer.wait()
            except Exception as e:  # noqa: BLE001
                logger.error("%s", e)
            return
        self.checkpointer.wait()
        if self.trainer.interrupted:  # to be resumed: not a final state
            return
        flush_writers(self)
        # trainer.iter is one past the last iteration run.
        final = f"{self.file_prefix}_final"
        self.checkpointer.save(final, iteration=self.trainer.iter - 1, asynchronous=False)
        if self.checkpointer.checkpoint_format() == "dcp":
            # model_final.dcp resumes; model_final.pth is the plain weights file
            # that evaluation and other tools load with torch.load.
            self.checkpointer.save_weights(final, iteration=self.trainer.iter - 1)
        if self.export_safetensors:
            self.checkpointer.save_safetensors(final)
