"""Writers: what turns the :class:`EventStorage` into files and console lines.

A writer reads the innermost storage (:func:`get_event_storage`) when its
:meth:`EventWriter.write` is called, typically every N iterations by a
periodic hook. Reading the storage resolves every pending tensor in one
batch, so a write costs one device sync however many scalars were put.

The three file writers (:class:`JSONWriter`, :class:`CSVWriter`,
:class:`TensorboardWriter`) share one rule for which scalars a write emits:

- a training scalar (any kind but ``"metric"``) is emitted once per write, at
  the iteration it was last put at, provided that iteration is newer than the
  last iteration the writer emitted: the median of its last ``window_size``
  values when put with ``smoothing_hint=True``, else its latest value (the
  learning rate);
- an evaluation result (put with ``kind="metric"``, as ``EvalHook`` does) is
  emitted for every value put since the last write, each at its own
  iteration, so an evaluation every 5 iterations is not dropped by a writer
  every 20;
- an iteration is emitted at most once: the writer remembers the last one, and
  :meth:`EventWriter.set_start_iter` resets it when training (re)starts.

Consequence: a value must be put before the write at its iteration. One put
at an iteration already written is not written (a warning names it).
"""

from __future__ import annotations

import csv
import datetime
import inspect
import io
import json
import logging
import math
import os
import re
import sys
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from typing import IO, Any, Dict, List, Optional, Set, Tuple, cast

import torch
from termcolor import colored

from treadle.utils.comm import is_main_process
from treadle.utils.file_io import PathManager

from .storage import EventStorage, ScalarKind, get_event_storage

__all__ = [
    "EventWriter",
    "JSONWriter",
    "CSVWriter",
    "TensorboardWriter",
    "CommonMetricPrinter",
    "get_default_writers",
]

logger = logging.getLogger(__name__)

# The key that holds the iteration in metrics.json and the first CSV column.
ITERATION_KEY = "iteration"

# Rows of one write: {iteration: {name: value}}, iterations in increasing order.
Rows = Dict[int, Dict[str, float]]


class EventWriter(ABC):
    """Base class of writers: something that flushes the storage somewhere.

    Contract:

    - :meth:`set_start_iter` is called once before training starts, with the
      first iteration that will run (after a resume, the first iteration that
      runs again). A writer drops or hides what an interrupted run wrote from
      that iteration on, so that no iteration appears twice.
    - :meth:`write` is called inside an open :class:`EventStorage`, any number
      of times; it never writes the same scalar at the same iteration twice.
      It must not clear the storage's images or histograms: the calling hook
      does that after every writer ran.
    - :meth:`close` releases files. A later :meth:`write` reopens them, so a
      writer can serve several ``train()`` calls.
    """

    @abstractmethod
    def write(self) -> None:
        """Writes what the current storage holds that this writer has not written yet."""

    def close(self) -> None:
        """Releases files; the default holds none."""

    def set_start_iter(self, start_iter: int) -> None:
        """Prepares for training that starts at ``start_iter``; the default does nothing."""

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_window_size(window_size: int) -> int:
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive int, got {window_size!r}")
    return window_size


def _check_start_iter(start_iter: int) -> int:
    if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
        raise ValueError(f"start_iter must be a non-negative int, got {start_iter!r}")
    return start_iter


def _same_point(a: Tuple[float, int], b: Tuple[float, int]) -> bool:
    # NaN != NaN: an unchanged NaN must not look like a new value.
    return a[1] == b[1] and (a[0] == b[0] or (math.isnan(a[0]) and math.isnan(b[0])))


class _IterationRowWriter(EventWriter):
    """Implements the selection rule of the module docstring for file writers.

    Subclasses call :meth:`_new_rows` in ``write`` and :meth:`_commit` once
    the rows are safely written.
    """

    def __init__(self, window_size: int) -> None:
        self._window_size = _check_window_size(window_size)
        # The last iteration emitted; everything at or before it is done.
        self._last_write = -1
        self._first_iter = 0
        # The latest (value, iteration) of each name seen at the previous write,
        # to notice values that arrive at an iteration already written.
        self._seen_latest: Dict[str, Tuple[float, int]] = {}

    @property
    def window_size(self) -> int:
        return self._window_size

    def set_start_iter(self, start_iter: int) -> None:
        start_iter = _check_start_iter(start_iter)
        self._last_write = start_iter - 1
        self._first_iter = start_iter
        self._seen_latest = {}

    def _new_rows(self, storage: EventStorage) -> Rows:
        latest = storage.latest()  # resolves pending tensors: the one sync of this write
        hints = storage.smoothing_hints()
        histories = storage.histories()
        rows: Dict[int, Dict[str, float]] = defaultdict(dict)
        for name, point in latest.items():
            if name == ITERATION_KEY:
                raise ValueError(
                    f"A scalar is named '{ITERATION_KEY}', which is the iteration key of "
                    f"{type(self).__name__}'s output; rename it."
                )
            value, it = point
            if storage.kind(name) == ScalarKind.METRIC:
                # Evaluation results: every one, whatever the periods.
                for v, i in histories[name].values_after(self._last_write):
                    rows[i][name] = v
            elif it > self._last_write:
                # Training series: one value per write, smoothed when hinted.
                rows[it][name] = histories[name].median(self._window_size) if hints[name] else value
            seen = self._seen_latest.get(name)
            if self._first_iter <= it <= self._last_write and (seen is None or not _same_point(seen, point)):
                logger.warning(
                    "%s: '%s' was put at iteration %d after that iteration was written; "
                    "it is not written. Put values before the writer runs at their iteration.",
                    type(self).__name__,
                    name,
                    it,
                )
            self._seen_latest[name] = point
        return dict(sorted(rows.items()))

    def _commit(self, rows: Rows) -> None:
        if rows:
            self._last_write = max(self._last_write, max(rows))


# ---------------------------------------------------------------------- files

_URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def _fsync(f: Any) -> None:
    try:
        os.fsync(f.fileno())
    except (AttributeError, OSError, io.UnsupportedOperation):
        pass  # a handler without a file descriptor (remote storage) has nothing to fsync


def _atomic_write_text(path: str, text: str) -> None:
    """Replaces ``path`` with ``text`` so that a crash leaves the old or the new file.

    The temporary file is written through PathManager in the same directory and
    fsynced, then renamed over ``path``. The rename is ``os.replace`` for local
    paths because iopath's ``mv`` refuses an existing destination; for URI
    paths (object stores, which have no rename) the object is replaced whole
    by a copy.
    """
    directory = os.path.dirname(path)
    if directory:
        PathManager.mkdirs(directory)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with PathManager.open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            _fsync(f)
        if _URI_SCHEME.match(path):
            PathManager.copy(tmp, path, overwrite=True)
            PathManager.rm(tmp)
        else:
            os.replace(tmp, path)
            # Make the rename itself durable.
            dir_fd = os.open(directory or ".", os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except BaseException:
        if PathManager.exists(tmp):
            PathManager.rm(tmp)
        raise


def _read_lines(path: str) -> Tuple[List[str], str]:
    """``(complete lines, each ending in '\\n', text after the last '\\n')``.

    The second item is non-empty when the file ends in a line cut short, e.g.
    by a crash in the middle of a write.
    """
    with PathManager.open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]], parts[-1]


def _open_for_append(path: str) -> IO[str]:
    directory = os.path.dirname(path)
    if directory:
        PathManager.mkdirs(directory)
    return PathManager.open(path, "a", encoding="utf-8", newline="")


def _json_value(v: float) -> Optional[float]:
    # NaN and infinities are not JSON; null is read by every parser (and by
    # pandas as NaN). The console line and NonFiniteLossError tell which it was.
    return v if math.isfinite(v) else None


def _json_line_iteration(line: str) -> Optional[int]:
    """The iteration of a metrics.json line, or None when it is not one."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    it = record.get(ITERATION_KEY)
    return it if isinstance(it, int) and not isinstance(it, bool) else None


class JSONWriter(_IterationRowWriter):
    """Appends scalars to a JSON-lines file (``metrics.json``).

    Each line is one JSON object: ``"iteration"`` first, then the scalars of
    that iteration by name. Lines are in increasing iteration order and no
    iteration has two lines. Which scalars a line holds follows the rule of
    this module's docstring: with a writer every 20 iterations, training
    scalars appear on lines 19, 39, ... (medians over ``window_size``), and an
    evaluation put every 5 iterations adds lines 4, 9, 14, and keys to line 19.

    NaN and infinite values are written as ``null`` (JSON has no NaN).

    The file is opened in append mode through ``PathManager`` at the first
    write and flushed after each write. :meth:`set_start_iter` first removes
    the lines at or after the start iteration, which an interrupted run wrote
    after its last checkpoint.

    Args:
        json_file: path of the file, e.g. ``output_dir/metrics.json``.
        window_size: number of values the median of a training scalar covers.
    """

    def __init__(self, json_file: str, window_size: int = 20) -> None:
        super().__init__(window_size)
        self._path = json_file
        self._file: Optional[IO[str]] = None

    @property
    def path(self) -> str:
        return self._path

    def write(self) -> None:
        rows = self._new_rows(get_event_storage())
        if not rows:
            return
        lines = []
        for it, scalars in rows.items():
            record: Dict[str, Any] = {ITERATION_KEY: it}
            record.update((k, _json_value(scalars[k])) for k in sorted(scalars))
            lines.append(json.dumps(record, allow_nan=False) + "\n")
        if self._file is None:
            self._file = _open_for_append(self._path)
        self._file.write("".join(lines))
        self._file.flush()
        self._commit(rows)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def set_start_iter(self, start_iter: int) -> None:
        """Drops the lines of iterations ``>= start_iter`` from the file.

        Other lines are kept byte for byte. A last line cut short by a crash is
        dropped with a warning; a line that is not a metrics record is kept,
        with a warning. The file is replaced atomically, and only if a line is
        dropped.
        """
        super().set_start_iter(start_iter)
        self.close()  # the file may be replaced: do not keep a handle on the old one
        if not PathManager.exists(self._path):
            return
        lines, tail = _read_lines(self._path)
        kept: List[str] = []
        changed = False
        for lineno, line in enumerate(lines, 1):
            it = _json_line_iteration(line)
            if it is None:
                if line.strip():
                    logger.warning(
                        "%s:%d is not a JSON object with an integer '%s'; kept as it is.",
                        self._path,
                        lineno,
                        ITERATION_KEY,
                    )
                kept.append(line)
            elif it >= start_iter:
                changed = True
            else:
                kept.append(line)
        if tail:
            changed = True
            it = _json_line_iteration(tail)
            if it is None:
                logger.warning(
                    "%s ends in an incomplete line (an interrupted write); dropped: %.80r",
                    self._path,
                    tail,
                )
            elif it < start_iter:
                kept.append(tail + "\n")  # complete record, only its newline was lost
        if changed:
            _atomic_write_text(self._path, "".join(kept))


def _csv_line(fields: List[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def _csv_fields(line: str) -> List[str]:
    return next(csv.reader([line]), [])


class CSVWriter(_IterationRowWriter):
    """Writes scalars to a CSV file, one row per iteration.

    The header is ``iteration`` then the scalar names in sorted order; a
    scalar absent from an iteration leaves its cell empty. Rows follow the
    same rule as :class:`JSONWriter`. When a write brings a name the header
    lacks (an evaluation metric appearing at the first evaluation, say), the
    file is rewritten atomically with the widened header, the existing rows
    gaining empty cells. Floats are written with ``repr`` (shortest exact
    form; ``nan``, ``inf``, ``-inf`` for non-finite values).

    :meth:`set_start_iter` drops rows at or after the start iteration, and a
    last row cut short by a crash (any last line without its newline: a cut
    CSV row may still parse), like :class:`JSONWriter`.

    Args:
        csv_file: path of the file.
        window_size: number of values the median of a training scalar covers.
    """

    def __init__(self, csv_file: str, window_size: int = 20) -> None:
        super().__init__(window_size)
        self._path = csv_file
        self._file: Optional[IO[str]] = None
        # Scalar columns of the file's header (without "iteration"); None until read.
        self._columns: Optional[List[str]] = None

    @property
    def path(self) -> str:
        return self._path

    def write(self) -> None:
        rows = self._new_rows(get_event_storage())
        if not rows:
            return
        if self._columns is None:
            self._columns = self._read_columns()
        names: Set[str] = set().union(*rows.values())
        if self._columns is None or not names <= set(self._columns):
            self._rewrite_with_columns(sorted(set(self._columns or ()) | names))
        columns = cast(List[str], self._columns)  # set by the read or the rewrite above
        text = "".join(
            _csv_line([str(it)] + [repr(scalars[c]) if c in scalars else "" for c in columns])
            for it, scalars in rows.items()
        )
        if self._file is None:
            self._file = _open_for_append(self._path)
        self._file.write(text)
        self._file.flush()
        self._commit(rows)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def set_start_iter(self, start_iter: int) -> None:
        """Drops rows of iterations ``>= start_iter`` and a torn last row; see the class."""
        super().set_start_iter(start_iter)
        self.close()
        self._columns = None  # read again from the file at the next write
        if not PathManager.exists(self._path):
            return
        lines, tail = _read_lines(self._path)
        changed = bool(tail)
        if tail:
            logger.warning("%s ends in an incomplete row (an interrupted write); dropped: %.80r", self._path, tail)
        if not lines:
            if changed:
                _atomic_write_text(self._path, "")
            return
        self._check_header(lines[0])
        kept = [lines[0]]
        for lineno, line in enumerate(lines[1:], 2):
            it = self._row_iteration(line)
            if it is None:
                if line.strip():
                    logger.warning("%s:%d does not start with an iteration; kept as it is.", self._path, lineno)
                kept.append(line)
            elif it >= start_iter:
                changed = True
            else:
                kept.append(line)
        if changed:
            _atomic_write_text(self._path, "".join(kept))

    @staticmethod
    def _row_iteration(line: str) -> Optional[int]:
        fields = _csv_fields(line)
        try:
            return int(fields[0]) if fields else None
        except ValueError:
            return None

    def _check_header(self, line: str) -> List[str]:
        fields = _csv_fields(line)
        if not fields or fields[0] != ITERATION_KEY:
            raise ValueError(
                f"{self._path} exists but is not a CSVWriter file: its header {line.strip()[:80]!r} "
                f"does not start with '{ITERATION_KEY}'. Move it away or choose another csv_file."
            )
        return fields[1:]

    def _read_columns(self) -> Optional[List[str]]:
        """The scalar columns of the file's header; None when there is no header yet."""
        if not PathManager.exists(self._path):
            return None
        lines, _ = _read_lines(self._path)
        return self._check_header(lines[0]) if lines else None

    def _rewrite_with_columns(self, columns: List[str]) -> None:
        self.close()
        out = [_csv_line([ITERATION_KEY] + columns)]
        if PathManager.exists(self._path):
            lines, tail = _read_lines(self._path)
            if tail:
                logger.warning("%s ends in an incomplete row (an interrupted write); dropped: %.80r", self._path, tail)
            if lines:
                old_columns = self._check_header(lines[0])
                for line in lines[1:]:
                    fields = _csv_fields(line)
                    if not fields:
                        continue
                    cells = dict(zip(old_columns, fields[1:]))
                    out.append(_csv_line([fields[0]] + [cells.get(c, "") for c in columns]))
        _atomic_write_text(self._path, "".join(out))
        self._columns = columns


# ---------------------------------------------------------------- tensorboard


class TensorboardWriter(_IterationRowWriter):
    """Writes scalars, images and histograms to TensorBoard event files.

    Scalars follow the rule of this module's docstring (the same points as
    :class:`JSONWriter`, as ``add_scalar(name, value, iteration)``). Every
    image and histogram in the storage is written at the iteration it was put
    at. The ``torch.utils.tensorboard.SummaryWriter`` is created at the first
    write, so a run that never writes leaves no event file; event files are
    written by TensorBoard's own file layer, not through ``PathManager``.

    After :meth:`set_start_iter` (``s``), the next ``SummaryWriter`` is opened
    with ``purge_step=s``: TensorBoard then hides every point at step ``>= s``
    from earlier event files in the directory, so a resumed run's curves
    replace, rather than overlap, what the interrupted run logged after its
    checkpoint. This holds for ``s == 0`` too, in line with
    :class:`JSONWriter` emptying ``metrics.json`` when training restarts from 0.

    Args:
        log_dir: directory of the event files.
        window_size: number of values the median of a training scalar covers.
        **kwargs: passed to ``SummaryWriter`` (``comment``, ``max_queue``,
            ``flush_secs``, ``filename_suffix``); ``purge_step`` is not
            accepted, :meth:`set_start_iter` sets it.
    """

    def __init__(self, log_dir: str, window_size: int = 20, **kwargs: Any) -> None:
        super().__init__(window_size)
        # Imported here, not at module level: importing tensorboard takes about
        # a second, which every user of treadle.events would pay otherwise.
        from torch.utils.tensorboard import SummaryWriter

        allowed = set(inspect.signature(SummaryWriter.__init__).parameters) - {"self", "log_dir", "purge_step"}
        if "purge_step" in kwargs:
            raise TypeError("TensorboardWriter sets purge_step itself from set_start_iter(); do not pass it")
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(
                f"TensorboardWriter got unknown SummaryWriter arguments {unknown}; known: {sorted(allowed)}"
            )
        self._summary_writer_cls = SummaryWriter
        self._log_dir = log_dir
        self._kwargs = kwargs
        self._purge_step: Optional[int] = None
        self._writer: Optional[Any] = None

    @property
    def log_dir(self) -> str:
        return self._log_dir

    def set_start_iter(self, start_iter: int) -> None:
        super().set_start_iter(start_iter)
        # A new event file is needed for the purge marker to apply to this run.
        self.close()
        self._purge_step = start_iter

    def _get_writer(self) -> Any:
        if self._writer is None:
            self._writer = self._summary_writer_cls(self._log_dir, purge_step=self._purge_step, **self._kwargs)
            # Purge once: reopening after close() must not hide this run's own points.
            self._purge_step = None
        return self._writer

    def write(self) -> None:
        storage = get_event_storage()
        rows = self._new_rows(storage)
        images, histograms = storage.images, storage.histograms
        if not rows and not images and not histograms:
            return
        writer = self._get_writer()
        for it, scalars in rows.items():
            for name in sorted(scalars):
                writer.add_scalar(name, scalars[name], it)
        for name, img, it in images:
            writer.add_image(name, img, it)
        for name, values, it, bins in histograms:
            writer.add_histogram(name, values, it, bins=bins)
        # Like JSONWriter: what was written is on disk, for a live TensorBoard and after a crash.
        writer.flush()
        self._commit(rows)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# ------------------------------------------------------------------- console

# Read through this name so that tests can control the clock.
_now = time.perf_counter


class CommonMetricPrinter(EventWriter):
    """Prints the usual training status to the console, one line per write.

    The line, logged at INFO on the ``"treadle"`` logger, looks like::

        eta: 0:01:23  iter: 199/1000  total_loss: 0.1234  loss_cls: 0.05  grad_norm: 1.2  time: 0.0123  data_time: 0.0010  samples/s: 2600  lr: 0.01  max_mem: 123M

    ``iter`` is 0-based, the same number as the ``iteration`` of
    ``metrics.json`` and the TensorBoard step; ``iter: 999/1000`` is the last
    iteration of a 1000-iteration run. Fields:

    - ``eta``: the median of ``time`` over ``window_size`` iterations times the
      iterations left; without a ``time`` scalar, the wall-clock time per
      iteration since the previous line (or since :meth:`set_start_iter`).
      Shown only with ``max_iter``.
    - every scalar of kind ``"loss"`` (medians), in the order first put, then
      ``grad_norm``, ``time`` and ``data_time`` (medians);
    - ``samples/s``: ``samples_per_iter`` over the median ``time``;
    - ``lr``: the latest value, not a median;
    - ``max_mem``: ``torch.cuda.max_memory_allocated()`` in MiB, only once CUDA
      is initialized (reading it is a host query, not a device sync).

    A field appears only if its scalar was put since the previous line, so a
    missing producer (no LR hook, no timer) just drops its field, and a
    second write at the same iteration prints nothing new. Evaluation
    results (scalars of kind ``"metric"``) are printed on their own line, ``metrics @ iter 99:  eval/acc: 0.91``, latest value per name,
    once each; every value is in ``metrics.json``.

    Args:
        max_iter: the iteration training ends before; ``None`` shows no eta.
        window_size: number of values the medians cover.
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
        self._window_size = _check_window_size(window_size)
        self._samples_per_iter = samples_per_iter
        self._color = sys.stdout.isatty() if color is None else bool(color)
        self._logger = logging.getLogger("treadle")
        self._first_iter = 0
        # The iteration of the last training line.
        self._last_iter = -1
        # Per evaluation scalar, the iteration of the value printed last.
        self._last_metric_iter: Dict[str, int] = {}
        # (clock, iteration) of the last training line: the ETA's fallback clock.
        self._clock_anchor: Optional[Tuple[float, int]] = None

    def set_start_iter(self, start_iter: int) -> None:
        start_iter = _check_start_iter(start_iter)
        self._first_iter = start_iter
        self._last_iter = start_iter - 1
        self._last_metric_iter = {}
        self._clock_anchor = (_now(), start_iter - 1)

    def write(self) -> None:
        storage = get_event_storage()
        latest = storage.latest()
        is_metric = {name: storage.kind(name) == ScalarKind.METRIC for name in latest}
        fresh = {name: it for name, (_, it) in latest.items() if not is_metric[name] and it > self._last_iter}
        if fresh:
            iteration = max(fresh.values())
            self._logger.info(self._training_line(storage, iteration, set(fresh)))
            self._last_iter = iteration
        by_iter: Dict[int, Dict[str, float]] = defaultdict(dict)
        for name, (value, it) in latest.items():
            if is_metric[name] and it > self._last_metric_iter.get(name, self._first_iter - 1):
                by_iter[it][name] = value
                self._last_metric_iter[name] = it
        for it in sorted(by_iter):
            fields = [self._field(name, by_iter[it][name], ".6g") for name in sorted(by_iter[it])]
            self._logger.info("  ".join([f"metrics @ iter {it}:"] + fields))

    def _training_line(self, storage: EventStorage, iteration: int, fresh: Set[str]) -> str:
        histories = storage.histories()

        hints = storage.smoothing_hints()

        def median(name: str) -> Optional[float]:
            if name not in fresh:
                return None
            return histories[name].median(self._window_size) if hints[name] else histories[name].latest()

        seconds_per_iter = median("time")
        parts: List[str] = []
        eta = self._eta_seconds(iteration, seconds_per_iter)
        if eta is not None:
            parts.append(self._field("eta", str(datetime.timedelta(seconds=int(round(eta))))))
        shown_iter = str(iteration) if self._max_iter is None else f"{iteration}/{self._max_iter}"
        parts.append(self._field("iter", shown_iter))
        # Storage keeps names in the order first put: the step's total_loss, then its terms.
        for name in histories:
            if name in fresh and storage.kind(name) == ScalarKind.LOSS:
                parts.append(self._field(name, histories[name].median(self._window_size), ".4g"))
        for name, fmt in (("grad_norm", ".4g"), ("time", ".4f"), ("data_time", ".4f")):
            value = median(name)
            if value is not None:
                parts.append(self._field(name, value, fmt))
        if self._samples_per_iter is not None and seconds_per_iter is not None and seconds_per_iter > 0:
            rate = self._samples_per_iter / seconds_per_iter
            parts.append(self._field("samples/s", rate, ".0f" if rate >= 100 else ".3g"))
        if "lr" in fresh:
            parts.append(self._field("lr", histories["lr"].latest(), ".5g"))
        if torch.cuda.is_initialized():  # False without CUDA, or when this run never used it
            parts.append(self._field("max_mem", f"{torch.cuda.max_memory_allocated() / 2**20:.0f}M"))
        self._clock_anchor = (_now(), iteration)
        return "  ".join(parts)

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


# ------------------------------------------------------------------ defaults


def get_default_writers(
    output_dir: str,
    max_iter: Optional[int] = None,
    window_size: int = 20,
    *,
    samples_per_iter: Optional[float] = None,
) -> List[EventWriter]:
    """The usual writers: console, ``output_dir/metrics.json`` and TensorBoard in ``output_dir``.

    Returns an empty list on processes other than the main one: only the main
    process writes. (The storage must still be read on every rank when a
    cross-rank reducer is installed; that is the calling hook's job.)
    """
    if not is_main_process():
        return []
    return [
        CommonMetricPrinter(max_iter, window_size, samples_per_iter=samples_per_iter),
        JSONWriter(os.path.join(output_dir, "metrics.json"), window_size),
        TensorboardWriter(output_dir, window_size),
    ]
