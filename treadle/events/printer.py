"""The console line of training status."""

from __future__ import annotations

import datetime
import logging
import math
import sys
import time
from collections import defaultdict
from typing import Any, Collection, Dict, List, Optional, Tuple

import torch
from termcolor import colored

from treadle.utils.logger import write_info_line
from .storage import EventStorage, ScalarKind, get_event_storage, has_event_storage
from .writer import EventWriter, check_start_iter, check_window_size

__all__ = ["CommonMetricPrinter", "after_iterations", "iterations_run"]

logger = logging.getLogger(__name__)


# Read through this name so that tests can control the clock.
_now = time.perf_counter

def after_iterations(count: int) -> str:
    """``"after 1200 iterations"``: how the log says when a result was computed,
    one way for a periodic evaluation and the final one (whose rows in
    ``metrics.json`` are at ``1199`` and ``max_iter``, detectron2's convention)."""
    return f"after {count} iteration{'' if count == 1 else 's'}"


def iterations_run(storage: EventStorage, iteration: int) -> int:
    """The iterations run when the result put at ``iteration`` was computed.

    detectron2 puts a result computed after iteration ``i`` (counted from 0)
    at ``i``, and the final evaluation's at the number of iterations run
    (``max_iter``): an iteration past every one run when it is written, that
    is past ``storage.iter`` during the loop, or at it once the loop has
    ended (``storage.loop_ended``, set by the trainer in ``after_train``).
    """
    past = iteration > storage.iter or (storage.loop_ended and iteration == storage.iter)
    return iteration if past else iteration + 1


def _duration(seconds: int) -> str:
    """``str(datetime.timedelta(seconds=seconds))``: ``H:MM:SS``, with days past 24 hours."""
    if 0 <= seconds < 86400:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return str(datetime.timedelta(seconds=seconds))


class CommonMetricPrinter(EventWriter):
    """Prints the usual training status to the console, one line per write.

    The line, logged at INFO on the ``"treadle.events.printer"`` logger (also
    :attr:`logger`), looks like::

        eta: 0:01:23  iter: 199/1000  total_loss: 0.1234  loss_cls: 0.05  grad_norm: 1.2  time: 0.0123  data_time: 0.0010  samples/s: 2600  lr: 0.01  max_mem: 123M

    ``iter`` is 0-based, the same number as the ``iteration`` of
    ``metrics.json`` and the TensorBoard step; ``iter: 999/1000`` is the last
    iteration of a 1000-iteration run. Fields:

    - ``eta``: the median of ``time`` over ``window_size`` iterations times the
      iterations left; without a ``time`` scalar, the wall-clock time per
      iteration since the previous line (or since :meth:`set_start_iter`).
      Shown only with ``max_iter``.
    - every scalar of kind ``"loss"`` (medians), in the order first put, then
      ``grad_norm``, ``time`` and ``data_time`` (medians); a scalar put
      without a kind whose name contains ``"loss"`` counts as a loss
      (detectron2 models publish ``loss_cls`` so); then scalars put without
      a kind whose name contains ``"[metric]"``, detectron2's mark for a
      training statistic (``[metric]grad_scaler``);
    - ``samples/s``: ``samples_per_iter`` over the median ``time``;
    - ``lr``: the latest value, not a median;
    - ``max_mem``: ``torch.cuda.max_memory_allocated()`` in MiB, only once CUDA
      is initialized (reading it is a host query, not a device sync).

    A field appears only if its scalar was put since the previous line, so a
    missing producer (no LR hook, no timer) just drops its field, and a
    second write at the same iteration prints nothing new. Evaluation
    results (scalars of kind ``"metric"``) are printed on their own line, ``metrics after 100 iterations:  eval/acc: 0.91``
    (counted as :class:`~treadle.hooks.EvalHook`'s line counts, :func:`iterations_run`), latest value per name,
    once each (after a resume, those restored with the checkpoint count as
    printed); every value is in ``metrics.json``. While the logger is not
    enabled for INFO (logging not set up: Python's default level is
    WARNING), no line is built, and what it would have shown counts as shown.

    Args:
        max_iter: the iteration training ends before; ``None`` shows no eta.
        window_size: iterations the medians cover (values put in the last
            ``window_size`` iterations, see ``EventStorage.count_samples``).
        samples_per_iter: samples one iteration consumes (over all ranks),
            for ``samples/s``; ``None`` leaves it out.
        color: highlight values with ANSI colors; ``None`` colors when stdout
            is a terminal.
    """

    def __init__(
        self,
        max_iter: Optional[int] = None,
        window_size: int = 20,
        *,
        samples_per_iter: Optional[float] = None,
        color: Optional[bool] = None,
    ) -> None:
        if max_iter is not None and (isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 0):
            raise ValueError(f"max_iter must be a non-negative int or None, got {max_iter!r}")
        if samples_per_iter is not None and (
            isinstance(samples_per_iter, bool)
            or not isinstance(samples_per_iter, (int, float))
            or not samples_per_iter > 0
        ):
            raise ValueError(f"samples_per_iter must be a positive number or None, got {samples_per_iter!r}")
        self._max_iter = max_iter
        self._window_size = check_window_size(window_size)
        self._samples_per_iter = samples_per_iter
        self._color = sys.stdout.isatty() if color is None else bool(color)
        # This module's logger (a child of "treadle", whose handlers print it), as
        # detectron2's printer logs to its module's: a test or a filter can
        # take the status lines apart from the rest of the log.
        self._logger = logger
        #: The logger the line goes to (detectron2's attribute).
        self.logger = self._logger
        self._first_iter = 0
        # The iteration of the last training line.
        self._last_iter = -1
        # Per evaluation scalar, the (iteration, value) printed last.
        self._last_metric: Dict[str, Tuple[int, float]] = {}
        # (clock, iteration) of the last training line: the ETA's fallback clock.
        self._clock_anchor: Optional[Tuple[float, int]] = None

    def set_start_iter(self, start_iter: int) -> None:
        start_iter = check_start_iter(start_iter)
        self._first_iter = start_iter
        self._last_iter = start_iter - 1
        # A resumed run's storage holds the evaluations of the run before
        # (restored with the checkpoint): history, printed then, not news.
        # The final one is at that run's max_iter, this run's start_iter.
        self._last_metric = {}
        if has_event_storage():
            storage = get_event_storage()
            kinds = storage.kinds()
            self._last_metric = {
                name: (it, value) for name, (value, it) in storage.latest().items() if kinds[name] == ScalarKind.METRIC
            }
        self._clock_anchor = (_now(), start_iter - 1)

    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        storage = get_event_storage()
        latest = storage.latest()
        kinds = storage.kinds()
        last_iter = self._last_iter
        fresh: Dict[str, int] = {}
        metrics = False
        for name, (_, it) in latest.items():
            if kinds[name] == ScalarKind.METRIC:
                metrics = True
            elif it > last_iter:
                fresh[name] = it
        # Nobody would see the lines (logging is not set up, or INFO is off):
        # they are not built, but what was shown is tracked as if they were,
        # so that lines resume where they would be once logging is enabled.
        shown = self._logger.isEnabledFor(logging.INFO)
        if fresh:
            iteration = max(fresh.values())
            if shown:
                self._log(self._training_line(storage, iteration, fresh))
            else:
                self._clock_anchor = (_now(), iteration)
            self._last_iter = iteration
        if metrics:
            self._write_metrics(storage, latest, kinds, shown)

    def _write_metrics(
        self, storage: EventStorage, latest: Dict[str, Tuple[float, int]], kinds: Dict[str, Optional[str]],
        shown: bool = True,
    ) -> None:
        by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
        for name, (value, it) in latest.items():
            if kinds[name] == ScalarKind.METRIC and self._is_new_metric(name, value, it):
                by_iter[it][name] = value
                self._last_metric[name] = (it, value)
        if not shown:
            return
        for it in sorted(by_iter):
            fields = [self._field(name, by_iter[it][name], ".6g") for name in sorted(by_iter[it])]
            self._log("  ".join([f"metrics {after_iterations(iterations_run(storage, it))}:"] + fields))

    def _is_new_metric(self, name: str, value: float, it: int) -> bool:
        """Not printed yet: from this run, and later than the last printed, or
        at its iteration with another value (an evaluation run again there)."""
        last = self._last_metric.get(name)
        if last is None:
            return it >= self._first_iter
        last_it, last_value = last
        if it != last_it:
            return it > last_it
        return not (value == last_value or (math.isnan(value) and math.isnan(last_value)))

    def _log(self, line: str) -> None:
        """Logs ``line`` at INFO, as ``logger.info(line)`` from here would.

        When only :func:`~treadle.utils.setup_logger`'s handlers would see
        it (the usual case), the line goes to them without a record
        (:func:`~treadle.utils.logger.write_info_line`, same text): a status
        line comes every few milliseconds on a fast step. Otherwise the
        record names this method as its origin without logging's search of
        the stack for it (``findCaller``), which is found once.
        """
        logger = self._logger
        if not logger.isEnabledFor(logging.INFO):
            return
        if not write_info_line(logger, line, lambda: self._record(line)):
            logger.handle(self._record(line))

    def _record(self, line: str) -> logging.LogRecord:
        # The record's origin is _log, named without logging's stack search.
        code = CommonMetricPrinter._log.__code__
        logger = self._logger
        return logger.makeRecord(
            logger.name, logging.INFO, code.co_filename, code.co_firstlineno, line, (), None, code.co_name
        )

    def _training_line(self, storage: EventStorage, iteration: int, fresh: Collection[str]) -> str:
        # The medians every writer of this flush shares (computed once).
        smoothed = storage.shared_smoothed_latest(self._window_size)
        kinds = storage.kinds()
        hints = storage.smoothing_hints()
        seconds_per_iter = smoothed["time"][0] if "time" in fresh else None
        # (label, value, format) of each field, in the order shown.
        fields: List[Tuple[str, Any, str]] = []
        eta = self._eta_seconds(iteration, seconds_per_iter)
        if eta is not None:
            fields.append(("eta", _duration(int(round(eta))), ""))
        fields.append(("iter", str(iteration) if self._max_iter is None else f"{iteration}/{self._max_iter}", ""))
        # Names come in the order first put: the step's total_loss, then its terms.
        # A scalar put without a kind whose name says "loss" (a detectron2
        # model's storage.put_scalar("loss_cls", ...)) is a loss too; losses
        # are shown as medians whatever their hint.
        marked = []
        for name in smoothed:
            if name not in fresh:
                continue
            kind = kinds[name]
            if kind == ScalarKind.LOSS or (kind is None and "loss" in name):
                value = smoothed[name][0] if hints[name] else storage.smoothed(name, self._window_size)
                fields.append((name, value, ".4g"))
            elif kind is None and "[metric]" in name:
                # detectron2's mark for a training statistic that is not a loss ("[metric]grad_scaler").
                marked.append((name, smoothed[name][0], ".4g"))
        fields += marked
        for name, fmt in (("grad_norm", ".4g"), ("time", ".4f"), ("data_time", ".4f")):
            if name in fresh:
                fields.append((name, smoothed[name][0], fmt))
        if self._samples_per_iter is not None and seconds_per_iter is not None and seconds_per_iter > 0:
            rate = self._samples_per_iter / seconds_per_iter
            fields.append(("samples/s", rate, ".0f" if rate >= 100 else ".3g"))
        if "lr" in fresh:
            fields.append(("lr", smoothed["lr"][0] if not hints["lr"] else storage.latest()["lr"][0], ".5g"))
        if torch.cuda.is_initialized():  # False when this run never used CUDA, and on CPU-only builds
            fields.append(("max_mem", f"{torch.cuda.max_memory_allocated() / 2**20:.0f}M", ""))
        self._clock_anchor = (_now(), iteration)
        if self._color:
            return "  ".join([self._field(label, value, fmt) for label, value, fmt in fields])
        return "  ".join([f"{label}: {value:{fmt}}" for label, value, fmt in fields])

    def _eta_seconds(self, iteration: int, seconds_per_iter: Optional[float]) -> Optional[float]:
        if self._max_iter is None:
            return None
        remaining = max(self._max_iter - iteration - 1, 0)
        if seconds_per_iter is not None:
            return seconds_per_iter * remaining
        if self._clock_anchor is None:
            return None
        then, then_iter = self._clock_anchor
        if iteration <= then_iter:
            return None
        return (_now() - then) / (iteration - then_iter) * remaining

    def _field(self, label: str, value: Any, fmt: str = "") -> str:
        text = format(value, fmt) if fmt else str(value)
        if not self._color:
            return f"{label}: {text}"
        bad = isinstance(value, float) and not math.isfinite(value)
        # force_color: the decision is ours (self._color), not termcolor's own tty test.
        return f"{label}: " + colored(text, "red" if bad else "cyan", attrs=["bold"], force_color=True)
