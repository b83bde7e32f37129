"""TensorBoard event files through ``torch.utils.tensorboard`` (rule: see ``writer``)."""

from __future__ import annotations

import glob
import inspect
import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from treadle.utils.file_io import describe_os_error
from treadle.utils.torch_internals import event_file_path, quiet_event_file_thread_errors, summary_file_writer

from .storage import get_event_storage
from .writer import IterationRowWriter

__all__ = ["TensorboardWriter", "TensorboardXWriter", "TensorBoardXWriter"]

logger = logging.getLogger(__name__)

# The longest a written scalar waits before it is in the event file on disk.
DEFAULT_FLUSH_SECS = 10.0
DEFAULT_MAX_QUEUE = 1000


class TensorboardWriter(IterationRowWriter):
    """Writes scalars, images and histograms to TensorBoard event files.

    Scalars follow the rule of this module's docstring (the same points as
    :class:`JSONWriter`, as ``add_scalar(name, value, iteration)``). Every
    image and histogram in the storage is written at the iteration it was put
    at. The ``torch.utils.tensorboard.SummaryWriter`` is created at the first
    write, so a run that never writes leaves no event file; event files are
    written by TensorBoard's own file layer, not through ``PathManager``.

    Scalars reach the event file in batches, at most ``flush_secs`` apart
    (10 seconds here; ``SummaryWriter``'s own default is 120): :meth:`write`
    keeps the rows and hands them to the ``SummaryWriter`` only when that
    much time has passed since the last batch, then waits until they are on
    disk. Handing them over every ``period`` iterations woke the
    ``SummaryWriter``'s thread each time, and the thread then took the
    interpreter from the training step: ~30 us per iteration of a 0.3 ms
    step with a write every 20 (``benchmarks/peers.py``). :meth:`flush`
    writes what is kept at once: ``PeriodicWriter`` calls it before a
    checkpoint is saved and at the end of training, so a ``kill -9`` loses
    no point at or before the last checkpoint (later ones are written again
    by the resumed run). Images and histograms are handed over when written.

    The scalars of one iteration travel as one event (a ``Summary`` with one
    value per scalar, each as ``add_scalar`` writes it), not one event per
    scalar: TensorBoard reads both alike.

    After :meth:`set_start_iter` (``s``), the next ``SummaryWriter`` is opened
    with ``purge_step=s``: TensorBoard then hides every point at step ``>= s``
    from earlier event files in the directory, so a resumed run's curves
    replace, rather than overlap, what the interrupted run logged after its
    checkpoint. This holds for ``s == 0`` too, in line with
    :class:`JSONWriter` emptying ``metrics.json`` when training restarts from 0.

    Args:
        log_dir: directory of the event files.
        window_size: number of values the median of a training scalar covers.
        **kwargs: passed to ``SummaryWriter`` (``comment``, ``max_queue``
            (default 1000 here), ``flush_secs`` (default 10 here),
            ``filename_suffix``);
            ``purge_step`` is not accepted, :meth:`set_start_iter` sets it.
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
        kwargs.setdefault("flush_secs", DEFAULT_FLUSH_SECS)
        # A batch holds up to flush_secs of rows: room for them all in the
        # queue lets write() return while the thread writes (SummaryWriter's 10 does not).
        kwargs.setdefault("max_queue", DEFAULT_MAX_QUEUE)
        self._flush_secs = float(kwargs["flush_secs"])
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._summary_cls = Summary
        self._summary_writer_cls = SummaryWriter
        self._log_dir = log_dir
        self._kwargs = kwargs
        self._purge_step: Optional[int] = None
        self._summary: Optional[Any] = None
        # Scalar rows written but not yet handed to the SummaryWriter, and
        # when the next batch is due (the first goes at once).
        self._kept_rows: List[Tuple[int, Dict[str, float]]] = []
        self._next_batch_time = 0.0

    @property
    def log_dir(self) -> str:
        return self._log_dir

    def set_start_iter(self, start_iter: int) -> None:
        super().set_start_iter(start_iter)
        # A new event file is needed for the purge marker to apply to this run;
        # close() writes what an earlier run left kept into the old one.
        self.close()
        self._purge_step = start_iter

    def _get_writer(self) -> Any:
        if self._summary is None:
            quiet_event_file_thread_errors()
            try:
                self._summary = self._summary_writer_cls(self._log_dir, purge_step=self._purge_step, **self._kwargs)
            except OSError as e:
                # Its first write failed (a full disk): the file it opened, where there is one.
                raise OSError(e.errno, describe_os_error(e), _newest_event_file(self._log_dir)) from e
            # Purge once: reopening after close() must not hide this run's own points.
            self._purge_step = None
        return self._summary

    @property
    def _writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (detectron2's attribute:
        ``writer._writer.add_scalar(...)``). No file exists before."""
        return self._get_writer()

    def write(self) -> None:
        if self._main_process is not True and self._only_reads_here():  # not the main process (a call only until known)
            return
        try:
            self._write()
        except OSError as e:
            raise self._failed(e) from e

    def _write(self) -> None:
        storage = get_event_storage()
        rows = self._new_rows(storage)
        images, histograms = storage.images, storage.histograms
        if not rows and not images and not histograms:
            return
        writer = self._get_writer()
        self._kept_rows.extend(rows.items())
        for name, img, it in images:
            writer.add_image(name, img, it)
        for name, values, it, bins in histograms:
            writer.add_histogram(name, values, it, bins=bins)
        self._commit(rows)
        if time.monotonic() >= self._next_batch_time:
            self.flush()

    def flush(self) -> None:
        """Hands every kept row to the ``SummaryWriter`` and waits until all
        that was written is in the event file on disk."""
        try:
            self._flush()
        except OSError as e:
            raise self._failed(e) from e

    def _failed(self, error: OSError) -> OSError:
        """The error of a write to the event file, naming the file. The
        ``SummaryWriter`` is let go of: closing it would fail again."""
        summary, self._summary = self._summary, None
        self._kept_rows = []
        path = event_file_path(summary) if summary is not None else self._log_dir
        if summary is not None:
            try:
                summary.close()
            except OSError:
                pass  # the same failure
        if error.filename is not None:
            return error  # already names what could not be written
        return OSError(error.errno, describe_os_error(error), path)

    def _flush(self) -> None:
        if self._summary is None:
            return
        if self._kept_rows:
            file_writer = summary_file_writer(self._summary)
            Summary, Value = self._summary_cls, self._summary_cls.Value
            for it, scalars in self._kept_rows:
                file_writer.add_summary(Summary(value=[Value(tag=n, simple_value=scalars[n]) for n in sorted(scalars)]), it)
            self._kept_rows = []
        self._summary.flush()
        self._next_batch_time = time.monotonic() + self._flush_secs

    def close(self) -> None:
        if self._summary is not None:
            self.flush()
            summary, self._summary = self._summary, None
            try:
                summary.close()
            except OSError as e:
                self._summary = summary
                raise self._failed(e) from e
        self._next_batch_time = 0.0


def _newest_event_file(log_dir: str) -> str:
    """The newest event file this process opened in ``log_dir`` (TensorBoard
    names them ``events.out.tfevents.{time}.{host}.{pid}.{n}``), else the directory."""
    pattern = os.path.join(glob.escape(log_dir), f"events.out.tfevents.*.{os.getpid()}.*")
    files = glob.glob(pattern)
    return max(files, key=os.path.getmtime) if files else log_dir


#: detectron2's names for the TensorBoard writer (it once used tensorboardX).
TensorboardXWriter = TensorboardWriter
TensorBoardXWriter = TensorboardWriter
