"""Profiling and memory reporting."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence

import torch

from treadle.utils import comm
from treadle.utils.atomic import is_local_path
from treadle.utils.file_io import PathManager

from .base import HookBase

__all__ = ["TorchProfiler", "TorchMemoryStats"]

logger = logging.getLogger(__name__)


class TorchProfiler(HookBase):
    """Profiles chosen iterations with ``torch.profiler`` and writes a Chrome
    trace per profiled iteration (``profiler-trace-iter{N}.json`` in
    ``output_dir``; open it in Perfetto or chrome://tracing).

    Args:
        enable_predicate: called with the trainer before each step; the step is
            profiled when it returns True (e.g. ``lambda t: 10 <= t.iter < 13``).
        output_dir: where traces are written (through PathManager).
        activities: ``torch.profiler.ProfilerActivity`` values; default CPU,
            plus CUDA when available.
        record_shapes, profile_memory, with_stack: passed to ``torch.profiler.profile``.
    """

    def __init__(
        self,
        enable_predicate: Callable[..., bool],
        output_dir: str,
        *,
        activities: Optional[Sequence[torch.profiler.ProfilerActivity]] = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
    ) -> None:
        self._enable_predicate = enable_predicate
        self._output_dir = output_dir
        if activities is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._activities = list(activities)
        self._options: Dict[str, Any] = dict(
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack
        )
        self._profiler: Optional[torch.profiler.profile] = None
        self.trace_files: list = []

    def before_step(self) -> None:
        if self._enable_predicate(self.trainer):
            self._profiler = torch.profiler.profile(activities=self._activities, **self._options)
            self._profiler.__enter__()
        else:
            self._profiler = None

    def after_step(self) -> None:
        if self._profiler is None:
            return
        self._profiler.__exit__(None, None, None)
        name = f"profiler-trace-iter{self.trainer.iter}"
        if comm.get_world_size() > 1:
            name += f"-rank{comm.get_rank()}"
        PathManager.mkdirs(self._output_dir)
        out_file = os.path.join(self._output_dir, name + ".json")
        if is_local_path(out_file):
            self._profiler.export_chrome_trace(out_file)
        else:
            # The profiler writes only to local files, and get_local_path is
            # for reading: what is written there is never uploaded.
            fd, local = tempfile.mkstemp(prefix=name + ".", suffix=".json")
            os.close(fd)
            try:
                self._profiler.export_chrome_trace(local)
                PathManager.copy_from_local(local, out_file, overwrite=True)
            finally:
                os.remove(local)
        self.trace_files.append(out_file)
        self._profiler = None
        logger.info("Wrote profiler trace %s", out_file)

    def after_train(self) -> None:
        # An exception inside a profiled step leaves the profiler open.
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None


class TorchMemoryStats(HookBase):
    """Logs CUDA memory statistics every ``period`` iterations, at most
    ``max_runs`` times; a no-op with one info line when CUDA is not in use.

    ``torch.cuda.memory_*`` are host-side allocator queries: they do not
    wait for the device.
    """

    def __init__(self, period: int = 20, max_runs: int = 10) -> None:
        self._period = period
        self._max_runs = max_runs
        self._runs = 0
        self._enabled = torch.cuda.is_available()

    def before_train(self) -> None:
        if not self._enabled:
            logger.info("TorchMemoryStats does nothing: CUDA is not available.")
            self.runs_at_last_iteration = False

    def after_step_period(self) -> Optional[int]:
        return self._period if self._enabled else 0

    def after_step(self) -> None:
        if not self._enabled or self._runs >= self._max_runs:
            return
        gib = 1024.0**3
        logger.info(
            "iter %d: max_reserved %.2f GiB, reserved %.2f GiB, max_allocated %.2f GiB, allocated %.2f GiB",
            self.trainer.iter,
            torch.cuda.max_memory_reserved() / gib,
            torch.cuda.memory_reserved() / gib,
            torch.cuda.max_memory_allocated() / gib,
            torch.cuda.memory_allocated() / gib,
        )
        self._runs += 1
        if self._runs == 1:
            logger.info("CUDA memory summary:\n%s", torch.cuda.memory_summary())
        torch.cuda.reset_peak_memory_stats()
