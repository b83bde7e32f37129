"""What the plain ``Trainer`` returns: every scalar per iteration and per epoch.

The names, documented for the users of other trainers (see ``docs/migrating.md``):

- per iteration (``history.iterations``, ``history["total_loss"]``): every
  scalar put into the storage, under its name: ``total_loss`` (the training
  loss; each loss of a dict of losses under its own name too), ``lr``,
  ``time``, ``data_time``, and the evaluation results (``loss``,
  ``accuracy``...), each at the iteration it was computed after;
- per epoch (``history.epochs``, one dict per epoch, and ``history.to_dict()``,
  a list per name): ``epoch`` (0-based), ``iteration`` (the epoch's last),
  the epoch's mean of each training scalar under its name (its last value
  for one put with ``smoothing_hint=False``: ``lr``), ``train_loss``
  (the mean ``total_loss``), the evaluation results of the epoch's end under
  their names, and ``eval_loss`` (the evaluation's ``loss``, when computed).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from treadle.events import ScalarKind, get_event_storage
from treadle.hooks import HookBase

from .hook_table import call_noted, callable_name


if TYPE_CHECKING:
    from treadle.events import EventStorage

__all__ = ["TrainingHistory", "EpochHistory", "EpochCallback", "RunHistory", "iteration_history"]

logger = logging.getLogger(__name__)

#: ``fn(trainer, epoch, metrics)``, called at the end of each epoch.
EpochCallback = Callable[[Any, int, Dict[str, float]], Any]


@dataclasses.dataclass
class TrainingHistory:
    """Every scalar of a run, per iteration and per epoch (names: see this module).

    Attributes:
        iterations: ``{name: [(iteration, value), ...]}`` for every scalar put.
        epochs: one dict per completed epoch.
    """

    iterations: Dict[str, List[Tuple[int, float]]] = dataclasses.field(default_factory=dict)
    epochs: List[Dict[str, float]] = dataclasses.field(default_factory=list)

    def __getitem__(self, name: str) -> List[float]:
        """The values of ``name`` in order, per iteration."""
        if name not in self.iterations:
            per_epoch = any(name in row for row in self.epochs)
            raise KeyError(f"No scalar named '{name}' in the history's iterations; known: {sorted(self.iterations)}"
                           + (f"; '{name}' is a value per epoch: history.to_dict()['{name}'] (qurious' train() "
                              "returns that dict)" if per_epoch else ""))
        return [v for _, v in self.iterations[name]]

    def __contains__(self, name: object) -> bool:
        return name in self.iterations

    def last(self, name: str) -> float:
        return self[name][-1]

    def to_dict(self) -> Dict[str, List[Optional[float]]]:
        """The epochs as ``{name: [value of epoch 0, value of epoch 1, ...]}``
        (``None`` for an epoch without that value), as qurious and Keras return it."""
        names: List[str] = []
        for row in self.epochs:
            names.extend(k for k in row if k not in names)
        return {name: [row.get(name) for row in self.epochs] for name in names}


def epoch_row(storage: "EventStorage", epoch: int, first: int, last: int, results_until: int) -> Dict[str, float]:
    """The epoch's row: each training scalar's value over ``first..last``
    (:meth:`~treadle.events.EventStorage.value_over`: its mean, the last value
    for a scalar put with ``smoothing_hint=False``, as ``lr``), and the latest
    evaluation results put at ``first..results_until``."""
    row: Dict[str, float] = {"epoch": epoch, "iteration": last}
    metrics: Dict[str, float] = {}
    for name, history in storage.histories().items():  # one read for the epoch
        if storage.kind(name) == ScalarKind.METRIC:
            found = history.values_between(first, results_until)
            if found:
                metrics[name] = found[-1]
            continue
        value = storage.value_over(name, first, last)
        if value is not None:
            row[name] = value
    if "total_loss" in row:
        row["train_loss"] = row["total_loss"]
    row.update(metrics)
    if "loss" in metrics:
        row["eval_loss"] = metrics["loss"]
    return row


class EpochHistory(HookBase):
    """Records each epoch's row (see this module) and calls the per-epoch callbacks.

    Runs after_epoch (see :class:`HookBase`): register it after the
    :class:`~treadle.hooks.EvalHook`, so that the last epoch's row holds the final
    evaluation. Each callback is called as ``fn(trainer, epoch, metrics)``
    (qurious' and pytorch-accelerated's ``on_epoch_end``) with the row just
    recorded; a callback may call ``trainer.request_stop(...)``.

    The rows are part of the checkpoint (:meth:`state_dict`): a resumed run's
    history holds every epoch of the run, those before the interruption
    included. The callbacks of those epochs are not called again: they ran
    in the process that trained them (a callback that writes a file or a
    tracker would otherwise write each of them twice).

    Args:
        epochs: the list rows are appended to (``TrainingHistory.epochs``).
        callbacks: functions called after each row is recorded.
    """

    def __init__(self, epochs: List[Dict[str, float]], callbacks: Iterable[EpochCallback] = ()) -> None:
        self.epochs = epochs
        self.callbacks = list(callbacks)
        for fn in self.callbacks:
            if not callable(fn):
                raise TypeError(f"callbacks must be functions fn(trainer, epoch, metrics), got {fn!r}")

    def state_dict(self) -> Dict[str, Any]:
        return {"epochs": [dict(row) for row in self.epochs]} if self.epochs else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        unknown = set(state) - {"epochs"}
        if unknown:
            raise KeyError(f"{type(self).__name__} got unknown state keys {sorted(unknown)}")
        # In place: the list is the trainer's TrainingHistory.epochs.
        self.epochs[:] = [dict(row) for row in state.get("epochs", [])]

    def after_epoch(self) -> None:
        trainer = self.trainer
        length, epoch = trainer.epoch_length, trainer.epoch
        assert length is not None and epoch is not None  # after_epoch runs only where epochs are known
        first = epoch * length
        # The epoch's last iteration run: fewer when training stopped early in it.
        last = min((epoch + 1) * length - 1, trainer.last_run_iter)
        # The final evaluation is put one past the last iteration.
        row = epoch_row(trainer.storage, epoch, first, last, results_until=last + 1)
        self.epochs.append(row)
        for fn in self.callbacks:
            # A failure is reported as the callback's, not as this hook's.
            call_noted(fn, f"callback {callable_name(fn)}", trainer, epoch, dict(row))


def iteration_history(storage: "EventStorage") -> Dict[str, List[Tuple[int, float]]]:
    """``TrainingHistory.iterations`` of a run: every scalar of ``storage`` per iteration."""
    histories = storage.histories()  # the one read of this run's values
    return {name: [(int(it), v) for v, it in h.values()] for name, h in histories.items()}


class RunHistory:
    """pytorch-accelerated's ``trainer.run_history``: the metrics a subclass or
    a callback records by name (``update_metric``), as its documented
    examples do from ``eval_epoch_end``.

    Each value is kept here, one per call, and published to the event
    storage when training runs (``metrics.json``, TensorBoard, the epoch's
    row of :class:`TrainingHistory`), as an evaluation result.

    As pytorch-accelerated's, it holds the losses by default:
    ``eval_loss_epoch`` (each evaluation's loss, recorded before
    ``eval_epoch_end``) and ``train_loss_epoch`` (each finished epoch's mean
    training loss, from ``history``'s rows).
    """

    def __init__(self, history: Optional[TrainingHistory] = None) -> None:
        self._metrics: Dict[str, List[Any]] = {}
        self._history = history

    def record(self, metric_name: str, metric_value: Any) -> None:
        """Keeps ``metric_value`` under ``metric_name`` without publishing it (a value the storage has already)."""
        self._metrics.setdefault(metric_name, []).append(metric_value)

    def _all(self) -> Dict[str, List[Any]]:
        metrics = dict(self._metrics)
        if self._history is not None and self._history.epochs:
            metrics.setdefault("train_loss_epoch", [row.get("train_loss") for row in self._history.epochs])
        return metrics

    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Records ``metric_value`` (a number or a one-element tensor) under ``metric_name``."""
        self.record(metric_name, metric_value)
        try:
            storage = get_event_storage()
        except RuntimeError:  # outside training: kept here only
            return
        storage.put_scalar(metric_name, metric_value, kind=ScalarKind.METRIC)

    def get_metric_names(self) -> List[str]:
        """The names recorded so far."""
        return list(self._all())

    def get_metric_values(self, metric_name: str) -> List[Any]:
        """Every value recorded under ``metric_name``, in order."""
        return list(self._all().get(metric_name, []))

    def get_latest_metric(self, metric_name: str) -> Any:
        """The last value recorded under ``metric_name``."""
        metrics = self._all()
        values = metrics.get(metric_name)
        if not values:
            raise KeyError(f"run_history has no value of {metric_name!r} (recorded: {sorted(metrics)})")
        return values[-1]
