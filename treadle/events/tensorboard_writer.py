"""TensorBoard event files through ``torch.utils.tensorboard`` (rule: see ``writer``)."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

from .storage import get_event_storage
from .writer import _IterationRowWriter

__all__ = ["TensorboardWriter", "TensorboardXWriter", "TensorBoardXWriter"]

logger = logging.getLogger(__name__)


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
        self._summary: Optional[Any] = None

    @property
    def log_dir(self) -> str:
        return self._log_dir

    def set_start_iter(self, start_iter: int) -> None:
        super().set_start_iter(start_iter)
        # A new event file is needed for the purge marker to apply to this run.
        self.close()
        self._purge_step = start_iter

    def _get_writer(self) -> Any:
        if self._summary is None:
            self._summary = self._summary_writer_cls(self._log_dir, purge_step=self._purge_step, **self._kwargs)
            # Purge once: reopening after close() must not hide this run's own points.
            self._purge_step = None
        return self._summary

    @property
    def _writer(self) -> Any:
        """The ``SummaryWriter``, opened on first use (detectron2's attribute:
        ``writer._writer.add_scalar(...)``). No file exists before."""
        return self._get_writer()

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
        if self._summary is not None:
            self._summary.close()
            self._summary = None


#: detectron2's names for the TensorBoard writer (it once used tensorboardX).
TensorboardXWriter = TensorboardWriter
TensorBoardXWriter = TensorboardWriter
