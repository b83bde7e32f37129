"""Writers: what turns the :class:`~treadle.events.EventStorage` into files and console lines.

A writer reads the innermost storage (:func:`~treadle.events.get_event_storage`) when its
:meth:`EventWriter.write` is called, typically every N iterations by a
periodic hook. Reading the storage resolves every pending tensor in one
batch, so a write costs one device sync however many scalars were put.

The three file writers (:class:`~treadle.events.JSONWriter`, :class:`~treadle.events.CSVWriter`,
:class:`~treadle.events.TensorboardWriter`) share one rule for which scalars a write emits:

- a training scalar (any kind but ``"metric"``) is emitted once per write, at
  the iteration it was last put at, provided that iteration is newer than the
  last iteration the writer emitted: the median of its values over the last ``window_size`` iterations
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

import logging
import math
import os
import time
from abc import ABC, abstractmethod
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from treadle.utils import comm
from treadle.utils.atomic import atomic_write
from treadle.utils.file_io import PathManager, describe_os_error

from .storage import EventStorage, ScalarKind, get_event_storage

__all__ = ["EventWriter", "IterationRowWriter", "AppendingFileWriter", "ITERATION_KEY"]

logger = logging.getLogger(__name__)

#: The key that holds the iteration in metrics.json and the first CSV column.
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
    - :meth:`write` is called inside an open :class:`~treadle.events.EventStorage`, any number
      of times; it never writes the same scalar at the same iteration twice.
      It must not clear the storage's images or histograms: the calling hook
      does that after every writer ran.
    - :meth:`flush` makes what :meth:`write` wrote durable (on disk, or
      handed over for good). ``write`` may leave it buffered, to keep the
      training thread from waiting on a disk or a server every period;
      ``PeriodicWriter`` calls ``flush`` before a checkpoint is saved and
      at the end of training.
    - :meth:`close` flushes and releases files. A later :meth:`write`
      reopens them, so a writer can serve several ``train()`` calls.

    treadle's writers (the files, the console line, the trackers) write on
    the main process only (:func:`~treadle.utils.comm.is_main_process`,
    decided at their first call): a script that builds the same writers on
    every rank writes each row once, with no guard. On the other processes
    a write only reads the storage, as the main process's write does, so
    that a read that is a collective (values reduced across ranks) is met
    on every rank; no file is opened there. A writer meant for every
    process (a file per rank, ``JSONWriter(f"metrics_rank{rank}.json")``)
    sets :attr:`every_rank`.
    """

    #: Whether this writer writes on every process, not only the main one
    #: (set it on a writer of per-rank files: ``writer.every_rank = True``).
    every_rank: bool = False

    # Whether this process writes; decided at the first call (see _only_reads_here).
    _main_process: Optional[bool] = None

    @abstractmethod
    def write(self) -> None:
        """Writes what the current storage holds that this writer has not written yet."""

    def flush(self) -> None:
        """Waits until what :meth:`write` wrote is durable; the default writes
        through and has nothing to wait for."""

    def close(self) -> None:
        """Releases files; the default holds none."""

    def set_start_iter(self, start_iter: int) -> None:
        """Prepares for training that starts at ``start_iter``; the default does nothing."""

    def _is_main_process(self) -> bool:
        """Whether this process writes (the main one). Decided at the first
        call, when the process group exists, not at construction: a writer
        may be built before ``init_process_group``."""
        main = self._main_process
        if main is None:
            main = self._main_process = self.every_rank or comm.is_main_process()
        return main

    def _only_reads_here(self) -> bool:
        """True on a process other than the main one, after reading the
        storage as the main process's :meth:`write` does (what is pending is
        resolved: a collective under a cross-rank reducer, which every rank
        must run at the same point); the caller then writes nothing."""
        if self._is_main_process():
            return False
        get_event_storage().materialize()
        return True

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_window_size(window_size: int) -> int:
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(f"window_size must be a positive int, got {window_size!r}")
    return window_size


def check_start_iter(start_iter: int) -> int:
    if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
        raise ValueError(f"start_iter must be a non-negative int, got {start_iter!r}")
    return start_iter


def _same_point(a: Tuple[float, int], b: Tuple[float, int]) -> bool:
    # NaN != NaN: an unchanged NaN must not look like a new value.
    return a[1] == b[1] and (a[0] == b[0] or (math.isnan(a[0]) and math.isnan(b[0])))


def _rows_since(
    storage: EventStorage, window_size: int, last_write: int, first_iter: int
) -> Tuple[Rows, List[Tuple[str, Tuple[float, int]]]]:
    """``(rows after last_write, [(name, latest point)] of names put at an
    iteration in [first_iter, last_write])``. Each writer computes its own:
    sharing them between the writers of a flush saved no measurable time
    (``benchmarks/peers.py --interleaved``, treadle-hooks +28.6 ± 1.1 µs per
    iteration with a shared copy, +28.8 ± 0.6 without)."""
    smoothed = storage.shared_smoothed_latest(window_size)  # resolves what is pending
    through = storage.rows_through  # after a deferred flush: training rows as of its iteration
    results_through = storage.results_through  # and its evaluation results
    latest = storage.latest()
    kinds = storage.kinds()
    rows: Rows = {}
    late = []
    for name, point in latest.items():
        if kinds[name] == ScalarKind.METRIC:
            # Evaluation results: every one, whatever the periods.
            for v, i in storage.history(name).values_after(last_write):
                if results_through is None or i <= results_through:
                    rows.setdefault(i, {})[name] = v
        elif through is not None and point[1] > through:
            # Recorded after the deferred flush (a hook's read in between): the point its write saw.
            as_of = storage.point_through(name, through, window_size)
            if as_of is None:
                continue
            if as_of[1] > last_write:
                rows.setdefault(as_of[1], {})[name] = as_of[0]
            continue  # not a late value: one recorded after the flush the rows are of
        elif point[1] > last_write:
            # Training series: one value per write, smoothed when hinted.
            row = rows.get(point[1])
            if row is None:
                row = rows[point[1]] = {}
            row[name] = smoothed[name][0]
        it = point[1]
        if first_iter <= it <= last_write:
            late.append((name, point))
    if ITERATION_KEY in latest:
        raise ValueError(
            f"A scalar is named '{ITERATION_KEY}', which is the iteration key of the writers' "
            "output (metrics.json, metrics.csv); rename it."
        )
    if len(rows) > 1:
        rows = dict(sorted(rows.items()))
    return rows, late


class IterationRowWriter(EventWriter):
    """Implements the selection rule of the module docstring for file writers.

    Subclasses call :meth:`_new_rows` in ``write`` and :meth:`_commit` once
    the rows are safely written.
    """

    def __init__(self, window_size: int) -> None:
        self._window_size = check_window_size(window_size)
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
        start_iter = check_start_iter(start_iter)
        self._last_write = start_iter - 1
        self._first_iter = start_iter
        self._seen_latest = {}

    def _new_rows(self, storage: EventStorage) -> Rows:
        """The rows this writer has not written yet (the rule of the module
        docstring); warns of values put at an iteration already written."""
        # Resolves pending tensors: the one sync of this write.
        rows, late = _rows_since(storage, self._window_size, self._last_write, self._first_iter)
        seen = self._seen_latest
        for name, point in late:
            before = seen.get(name)
            if before is None or not _same_point(before, point):
                logger.warning(
                    "%s: '%s' was put at iteration %d after that iteration was written; "
                    "it is not written. Put values before the writer runs at their iteration.",
                    type(self).__name__,
                    name,
                    point[1],
                )
        self._seen_latest = dict(storage.latest())
        return rows

    def _commit(self, rows: Rows) -> None:
        if rows:
            self._last_write = max(self._last_write, max(rows))


# ---------------------------------------------------------------------- files

def atomic_write_text(path: str, text: str) -> None:
    """Replaces ``path`` with ``text`` so that a crash leaves the old or the new file."""
    directory = os.path.dirname(path)
    if directory:
        PathManager.mkdirs(directory)
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def read_lines(path: str) -> Tuple[List[str], str]:
    """``(complete lines, each ending in '\\n', text after the last '\\n')``.

    The second item is non-empty when the file ends in a line cut short, e.g.
    by a crash in the middle of a write.
    """
    with PathManager.open(path, "r", encoding="utf-8", newline="") as f:
        text = f.read()
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]], parts[-1]


def lines_before(
    path: str,
    lines: List[str],
    start_iter: int,
    iteration_of: Callable[[str], Optional[int]],
    not_a_record: str,
    first_lineno: int = 1,
) -> Tuple[List[str], bool]:
    """``(the lines of iterations < start_iter, whether any line was dropped)``.

    A line whose iteration cannot be read is kept, with a warning that it
    ``not_a_record`` (unless it is blank).
    """
    kept: List[str] = []
    dropped = False
    for lineno, line in enumerate(lines, first_lineno):
        it = iteration_of(line)
        if it is None:
            if line.strip():
                logger.warning("%s:%d %s; kept as it is.", path, lineno, not_a_record)
            kept.append(line)
        elif it >= start_iter:
            dropped = True
        else:
            kept.append(line)
    return kept, dropped


def _open_for_append(path: str) -> IO[str]:
    directory = os.path.dirname(path)
    if directory:
        PathManager.mkdirs(directory)
    return PathManager.open(path, "a", encoding="utf-8", newline="")


#: Seconds a file writer's lines may wait in its buffer before they are
#: handed to the operating system (see AppendingFileWriter).
DEFAULT_FILE_FLUSH_SECS = 1.0


class AppendingFileWriter(IterationRowWriter):
    """A row writer that appends text to one file, opened when first needed
    (so that a writer closed after a run works again in the next).

    Lines reach the file at the first write and then at most ``flush_secs``
    apart, not at every write: a write every 20 iterations of a fast step
    would otherwise be a system call every few milliseconds. :meth:`flush`
    (which ``PeriodicWriter`` calls before every checkpoint and at the end
    of training) and :meth:`close` write everything out, so a checkpoint is
    never on disk before the lines of its iterations.
    """

    def __init__(self, path: str, window_size: int, flush_secs: float = DEFAULT_FILE_FLUSH_SECS) -> None:
        super().__init__(window_size)
        if isinstance(flush_secs, bool) or not isinstance(flush_secs, (int, float)) or not flush_secs >= 0:
            raise ValueError(f"flush_secs must be a non-negative number of seconds, got {flush_secs!r}")
        self._path = path
        self._file: Optional[IO[str]] = None
        self._flush_secs = float(flush_secs)
        self._next_flush = 0.0

    @property
    def path(self) -> str:
        return self._path

    def _append(self, text: str) -> None:
        try:
            if self._file is None:
                self._file = _open_for_append(self._path)
            self._file.write(text)
            now = time.monotonic()
            if now >= self._next_flush:
                self._file.flush()
                self._next_flush = now + self._flush_secs
        except OSError as e:
            raise self._failed(e) from e

    def flush(self) -> None:
        """Hands every line written so far to the operating system."""
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as e:
                raise self._failed(e) from e

    def close(self) -> None:
        file, self._file = self._file, None
        self._next_flush = 0.0
        if file is not None:
            try:
                file.close()
            except OSError as e:
                raise self._failed(e) from e

    def _failed(self, error: OSError) -> OSError:
        """The error of a write to this writer's file, naming the file (a full
        disk is otherwise told by whichever hook flushed). The file is let go
        of: its buffer cannot be written, and closing it would fail again."""
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass  # the same failure, with the same lines
        return OSError(error.errno, describe_os_error(error), self._path)
