"""The run summary: what a run achieved and cost, at its end, on the console
and in ``summary.json``."""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
from tabulate import tabulate

from treadle.evaluation.registry import metric_mode
from treadle.events.storage import ScalarKind
from treadle.utils import comm
from treadle.utils.atomic import atomic_write

from .base import HookBase

if TYPE_CHECKING:
    from treadle.checkpoint import Checkpointer

__all__ = ["RunSummary"]

logger = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def _number(value: float) -> Optional[float]:
    """JSON has no NaN or infinity: ``None`` stands for them."""
    return value if math.isfinite(value) else None


def _peak_host_memory_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux


class RunSummary(HookBase):
    """Logs a summary of the run when training ends, and writes it to
    ``{output_dir}/summary.json`` (main process only).

    The summary holds: how training ended (``finished``, ``interrupted`` or
    ``failed``, with the error's first line), the iterations run, the wall
    time and iterations (and samples) per second, the peak host memory (the
    process's maximum resident set) and, on CUDA, the peak memory allocated
    by tensors; the final value of every scalar (the losses and learning
    rate of the last iteration, the last evaluation results); for every
    evaluation result, its best value and the iteration of the best (the
    direction from :func:`~treadle.evaluation.metric_mode`: ``loss`` lower,
    ``accuracy`` higher); and where the checkpoints are.

    Register it last: its ``after_train`` runs after the checkpointer has
    written ``model_final`` and the writers have flushed. It needs nothing
    before ``before_train``; it reads the trainer's storage and, when given
    or when the trainer has one, its checkpointer.

    Args:
        output_dir: where ``summary.json`` goes; ``None`` logs only.
        samples_per_iter: samples one iteration consumes over all ranks
            (adds samples/s).
        checkpointer: the run's; defaults to ``trainer.checkpointer``.
    """

    def __init__(
        self,
        output_dir: Optional[str] = None,
        *,
        samples_per_iter: Optional[float] = None,
        checkpointer: Optional["Checkpointer"] = None,
    ) -> None:
        self.output_dir = output_dir
        self.samples_per_iter = samples_per_iter
        self._checkpointer = checkpointer
        self._start_time: Optional[float] = None
        self._start_iter = 0
        self.summary: Dict[str, Any] = {}

    def before_train(self) -> None:
        self._start_time = time.perf_counter()
        self._start_iter = self.trainer.iter
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def after_train(self) -> None:
        self.summary = self.collect()
        if not comm.is_main_process():
            return
        logger.info("Run summary:\n%s", self.describe(self.summary))
        if self.output_dir:
            path = os.path.join(self.output_dir, SUMMARY_FILE)
            text = json.dumps(self.summary, indent=2, sort_keys=False) + "\n"
            try:
                atomic_write(path, lambda f: f.write(text.encode("utf-8")))
            except OSError as e:  # the run's own files matter more than its summary
                logger.warning("Cannot write %s: %s", path, e.strerror or e)

    # ------------------------------------------------------------------ content
    def collect(self) -> Dict[str, Any]:
        """The summary as a JSON-ready dict."""
        trainer = self.trainer
        seconds = time.perf_counter() - (self._start_time or time.perf_counter())
        iterations = max(trainer.iter - self._start_iter, 0)
        error = getattr(trainer, "training_error", None)
        status = "failed" if error is not None else ("interrupted" if getattr(trainer, "interrupted", False) else "finished")
        out: Dict[str, Any] = {
            "status": status,
            "start_iter": self._start_iter,
            "last_iter": trainer.iter - 1,
            "iterations": iterations,
            "seconds": round(seconds, 3),
            "iterations_per_second": _number(iterations / seconds) if seconds > 0 else None,
        }
        if error is not None:
            text = str(error).strip().splitlines()
            out["error"] = f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
            out["failed_at_iter"] = trainer.iter  # the iteration that raised; last_iter is the last one completed
        if self.samples_per_iter and seconds > 0:
            out["samples_per_second"] = _number(iterations * self.samples_per_iter / seconds)
        out["peak_host_memory_mib"] = round(_peak_host_memory_bytes() / 2**20, 1)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["peak_cuda_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out.update(self._metrics())
        out["checkpoints"] = self._checkpoints()
        return out

    def _metrics(self) -> Dict[str, Any]:
        storage = getattr(self.trainer, "storage", None)
        if storage is None:
            return {"final": {}, "best": {}}
        latest = storage.latest()  # resolves pending values: once, at the end
        final = {name: {"value": _number(value), "iteration": it} for name, (value, it) in sorted(latest.items())}
        best: Dict[str, Any] = {}
        for name, history in sorted(storage.histories().items()):
            if storage.kind(name) != ScalarKind.METRIC:
                continue
            points = [(v, i) for v, i in history.values() if math.isfinite(v)]
            if not points:
                continue
            mode = metric_mode(name)
            value, it = (max if mode == "max" else min)(points, key=lambda p: p[0])
            best[name] = {"value": value, "iteration": it, "mode": mode}
        return {"final": final, "best": best}

    def _checkpoints(self) -> Dict[str, Any]:
        checkpointer = self._checkpointer or getattr(self.trainer, "checkpointer", None)
        if checkpointer is None or not getattr(checkpointer, "save_dir", ""):
            return {}
        return {
            "directory": checkpointer.save_dir,
            "last_checkpoint": checkpointer.get_checkpoint_file() or None,
            "files": [os.path.basename(p) for p in checkpointer.get_all_checkpoint_files()],
        }

    @staticmethod
    def describe(summary: Dict[str, Any]) -> str:
        """The console form of a summary: a table of the run, then the metrics."""
        rate = summary.get("iterations_per_second")
        rows: List[List[Any]] = [
            ["status", summary["status"] + (
                f" at iteration {summary['failed_at_iter']} ({summary['error']})" if "error" in summary else "")],
            ["iterations", f"{summary['iterations']} (to iteration {summary['last_iter']})"],
            ["wall time", f"{summary['seconds']:.1f} s" + (f", {rate:.2f} it/s" if rate else "")],
        ]
        if summary.get("samples_per_second"):
            rows.append(["samples/s", f"{summary['samples_per_second']:.1f}"])
        rows.append(["peak host memory", f"{summary['peak_host_memory_mib']:.0f} MiB"])
        if "peak_cuda_memory_mib" in summary:
            rows.append(["peak CUDA memory", f"{summary['peak_cuda_memory_mib']:.0f} MiB"])
        run_rows = {row[0] for row in rows} | {"last checkpoint"}
        for scalar, point in summary.get("final", {}).items():
            # a scalar named like a run row (the timer's "time") would read as a second value of one thing
            name = f"final {scalar}" if scalar in run_rows else scalar
            best = summary.get("best", {}).get(scalar)
            value = "nan" if point["value"] is None else f"{point['value']:.6g}"
            text = f"{value} (iteration {point['iteration']})"
            if best is not None:
                text += f"; best {best['value']:.6g} at iteration {best['iteration']}"
            rows.append([name, text])
        checkpoints = summary.get("checkpoints") or {}
        if checkpoints.get("last_checkpoint"):
            rows.append(["last checkpoint", checkpoints["last_checkpoint"]])
        return tabulate(rows, tablefmt="plain")
