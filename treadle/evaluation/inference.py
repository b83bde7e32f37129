"""The evaluation loop: run a model over a data loader and feed an evaluator."""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import torch
from torch import nn

from treadle.utils import comm
from treadle.utils.device import resolve_device
from treadle.utils.frame_stack import call_with_frame_room

from .batch import ForwardFn, forward_batch, move_to_device
from .evaluator import DatasetEvaluator, as_evaluator
from .results import Results, format_results

__all__ = ["inference_context", "inference_on_dataset"]

logger = logging.getLogger(__name__)

EvaluatorArg = Union[None, DatasetEvaluator, Sequence[DatasetEvaluator]]


@contextlib.contextmanager
def inference_context(model: Any) -> Iterator[None]:
    """Puts ``model`` in eval mode for the block, then restores every
    submodule's own mode, even when the block raises.

    Restoring module by module, not with one ``model.train(previous)``, keeps
    submodules that were deliberately in eval mode (a frozen BatchNorm inside a
    training model) as they were. Objects that are not ``nn.Module`` pass through.
    """
    if not isinstance(model, nn.Module):
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        # The root's train() first, so that a model overriding train() sees the
        # call it expects; then the flags it may have flattened.
        model.train(modes[0][1])
        for module, training in modes:
            module.training = training


def _length(loader: Iterable[Any]) -> Optional[int]:
    try:
        return len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None


def _fmt_seconds(seconds: float) -> str:
    return str(datetime.timedelta(seconds=int(round(seconds))))


class _Progress:
    """Logs progress every ``period`` seconds of wall time, not every batch."""

    def __init__(self, total: Optional[int], period: float, num_warmup: int) -> None:
        self.total = total
        self.period = period
        # The first batches pay for lazy initialization (allocator, autotuning,
        # compilation); the ETA is taken from the batches after them.
        self.num_warmup = num_warmup
        self.start = time.perf_counter()
        self.warm_start: Optional[float] = None
        self.last_log = self.start
        self.data_time = 0.0
        self.compute_time = 0.0

    def batch_done(self, index: int, data_time: float, compute_time: float) -> None:
        now = time.perf_counter()
        done = index + 1
        self.data_time += data_time
        self.compute_time += compute_time
        if done == self.num_warmup:
            self.warm_start = now
        if now - self.last_log < self.period:
            return
        self.last_log = now
        elapsed = now - self.start
        msg = (
            f"Inference: batch {done}/{self.total if self.total is not None else '?'}. "
            f"data {self.data_time / done:.4f} s/batch, "
            f"compute {self.compute_time / done:.4f} s/batch, "
            f"total {elapsed / done:.4f} s/batch"
        )
        if self.total is not None:
            if self.warm_start is not None and done > self.num_warmup:
                per_batch = (now - self.warm_start) / (done - self.num_warmup)
            else:
                per_batch = elapsed / done
            msg += f". ETA={_fmt_seconds(per_batch * (self.total - done))}"
        logger.info(msg)

    def finished(self, num_batches: int) -> None:
        elapsed = time.perf_counter() - self.start
        per_batch = elapsed / num_batches if num_batches else 0.0
        logger.info(
            "Total inference time: %s (%.4f s/batch over %d batches on this process)",
            datetime.timedelta(seconds=elapsed),
            per_batch,
            num_batches,
        )


def inference_on_dataset(
    model: Any,
    data_loader: Iterable[Any],
    evaluator: EvaluatorArg,
    *,
    device: Union[None, str, torch.device] = None,
    forward: Optional[ForwardFn] = None,
    log_period: float = 5.0,
) -> Results:
    """Runs ``model`` over every batch of ``data_loader`` and returns the
    evaluator's results.

    The pass runs under ``torch.no_grad()`` with the model in eval mode; every
    module's mode is restored afterwards, also when the model or evaluator
    raises. Each batch is moved to ``device`` when given (the model is not
    moved: it is the caller's), fed by ``forward(model, batch)`` (default:
    :func:`~treadle.evaluation.batch.forward_batch`) and handed whole to
    ``evaluator.process(batch, outputs)``.

    Args:
        model: an ``nn.Module`` (DDP-wrapped or not) or any callable.
        data_loader: any iterable of batches; with ``len()``, progress logs an ETA.
            In distributed runs each rank iterates its own shard; the shards
            should not overlap or pad, or padded samples are counted twice.
        evaluator: a :class:`DatasetEvaluator`, a list of them, or ``None`` to
            only run the model (returns ``{}``).
        device: where to move each batch (``"auto"`` picks cuda, mps or cpu;
            a device this machine lacks is refused before the first batch).
        forward: ``forward(model, batch) -> outputs``, to feed batches another way.
        log_period: seconds of wall time between progress messages.

    Returns:
        The merged results of the evaluators, the same on every rank for the
        built-in evaluators; ``{}`` where an evaluator returns ``None``.
    """
    if log_period < 0:
        raise ValueError(f"log_period must be >= 0 seconds, got {log_period}")
    evaluator = as_evaluator(evaluator)
    feed = forward if forward is not None else forward_batch
    # Checked before the first batch: a missing CUDA is one line, not torch's assertion mid-loop.
    target = resolve_device(device) if device is not None else None
    total = _length(data_loader)
    logger.info(
        "Start inference on %s batches",
        total if total is not None else "an unknown number of",
    )
    evaluator.reset()
    progress = _Progress(total, log_period, num_warmup=min(5, total - 1) if total else 5)

    def run_batches() -> int:
        num_batches = 0
        with inference_context(model), torch.no_grad():
            data_start = time.perf_counter()
            for index, batch in enumerate(data_loader):
                compute_start = time.perf_counter()
                if target is not None:
                    batch = move_to_device(batch, target)
                outputs = feed(model, batch)
                evaluator.process(batch, outputs)
                compute_end = time.perf_counter()
                num_batches = index + 1
                progress.batch_done(index, compute_start - data_start, compute_end - compute_start)
                data_start = time.perf_counter()
        return num_batches

    # Each batch's forward in one frame-stack chunk, as the training loop's.
    progress.finished(call_with_frame_room(run_batches))

    results = evaluator.evaluate()
    if results is None:
        return {}
    results = dict(results)
    if results and comm.is_main_process():
        logger.info("Evaluation results:\n%s", format_results(results))
    return results
