"""Where a flush of the writers goes, in a training run.

The plain ``Trainer`` with an ``output_dir`` (console line, ``log.txt``,
``metrics.json``, TensorBoard, every ``--period`` iterations) trains
``benchmarks/peers.py``'s workload; each part of every flush is timed where
it runs, right after a training step (the storage's reading of pending
values, each writer's ``write``), and the whole from ``trainer.timings()``
(``PeriodicWriter.after_step``). A flush costs several times what the same
code costs in a micro-benchmark: the step has evicted it from the CPU caches.

Runs alternate between the console line written straight to
``setup_logger``'s handlers (``write_info_line``, treadle's default) and the
same line as a ``LogRecord`` through ``logging`` (what any other handler on
the ``treadle`` logger gets), so that the difference is measured on one
machine at one time. Medians of ``--rounds`` runs, microseconds per flush.
Timing the parts adds a few microseconds to the whole.

Not in a flush: TensorBoard's share of the rows. ``TensorboardWriter``
keeps them and hands them to TensorBoard's file writer every ``flush_secs``
(10 s) and at the end, where each is made an event, framed and
checksummed (TensorBoard's CRC32C is pure Python); the last row of the
table is that hand-over, per row.

Run: ``python benchmarks/flush.py`` (``--rounds``, ``--iters``, ``--width``, ``--period``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peers import Workload  # noqa: E402

import treadle.events.printer as printer_module  # noqa: E402
import treadle.events.storage as storage_module  # noqa: E402
from treadle.trainer import Trainer  # noqa: E402
from treadle.events import TensorboardWriter  # noqa: E402
from treadle.hooks import PeriodicWriter  # noqa: E402

# Not part of a flush: rows reach TensorBoard's file writer in batches, every
# flush_secs (10 s), and at the end; per row handed over.
HANDOVER = "TensorBoard hand-over, per row (every 10 s)"


def _timed(function: Callable[..., Any], key: str, seconds: Dict[str, float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[key] += time.perf_counter() - start

    return timed


def one_run(work: Workload, period: int, records: bool) -> Dict[str, float]:
    """Microseconds per flush of each part, with the console line as a record or not."""
    seconds: Dict[str, float] = collections.defaultdict(float)
    model, optimizer, loader = work.fresh()
    write_line = printer_module.write_info_line
    storage_flush = storage_module.EventStorage.flush
    with tempfile.TemporaryDirectory() as folder, open(os.devnull, "w") as devnull:
        trainer = Trainer(model, optimizer, loader, loss_fn=F.cross_entropy, max_iter=work.iters, log_period=period,
                          output_dir=os.path.join(folder, "run"), device="cpu", progress_bar=False)
        writers = next(h for h in trainer.hooks if isinstance(h, PeriodicWriter)).writers
        for writer in writers:
            writer.write = _timed(writer.write, type(writer).__name__, seconds)  # type: ignore[method-assign]
        tensorboard = next(w for w in writers if isinstance(w, TensorboardWriter))
        handed_rows = _count_handed_rows(tensorboard, seconds)
        storage_module.EventStorage.flush = _timed(storage_flush, "storage (pending values)", seconds)  # type: ignore[method-assign]
        if records:
            printer_module.write_info_line = lambda *args: False  # the caller then logs a record
        try:
            with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
                trainer.train()
        finally:
            printer_module.write_info_line = write_line
            storage_module.EventStorage.flush = storage_flush  # type: ignore[method-assign]
        seconds["whole flush (PeriodicWriter.after_step)"] = trainer.timings()["PeriodicWriter.after_step"]
    flushes = work.iters // period
    per_flush = {key: value / flushes * 1e6 for key, value in seconds.items() if key != HANDOVER}
    per_flush[HANDOVER] = seconds[HANDOVER] / handed_rows[0] * 1e6
    return per_flush


def _count_handed_rows(writer: TensorboardWriter, seconds: Dict[str, float]) -> List[int]:
    """Times ``writer.flush`` (the hand-over of kept rows to TensorBoard's
    file writer, which frames and checksums them) and counts the rows it
    hands over; ``[rows]``, filled as training runs. The first hand-over
    (one row, at the first write) is left out: it opens the event file."""
    rows = [0]
    flush = writer.flush
    calls = [0]

    def counted() -> None:
        calls[0] += 1
        if calls[0] == 1:
            return flush()
        rows[0] += len(writer._kept_rows)
        start = time.perf_counter()
        try:
            flush()
        finally:
            seconds[HANDOVER] += time.perf_counter() - start

    writer.flush = counted  # type: ignore[method-assign]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--iters", type=int, default=3000)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--period", type=int, default=20)
    args = parser.parse_args()
    if args.period < 1:
        parser.error(f"--period must be at least 1, got {args.period}")
    if args.iters < 2 * args.period:
        # The first flush's hand-over is left out: the figures need a second.
        parser.error(f"--iters must be at least twice --period (got --iters {args.iters}, --period {args.period})")
    logging.basicConfig(stream=open(os.devnull, "w"), level=logging.INFO, force=True)
    work = Workload(args.width, args.iters)
    runs: Dict[bool, List[Dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for records in (False, True):  # alternated: a drift of the machine hits both alike
            runs[records].append(one_run(work, args.period, records))
    keys = list(runs[False][0])
    print(f"microseconds per flush (every {args.period} iterations, width {args.width}, {args.iters} iterations, "
          f"one thread), medians of {args.rounds} alternated runs")
    print(f"{'part':<46} {'line without record':>20} {'line as a record':>17}")
    for key in keys:
        plain = statistics.median(run[key] for run in runs[False])
        record = statistics.median(run[key] for run in runs[True])
        print(f"{key:<46} {plain:20.1f} {record:17.1f}")
    step = statistics.median(run["whole flush (PeriodicWriter.after_step)"] for run in runs[False]) / args.period
    handover = statistics.median(run[HANDOVER] for run in runs[False]) / args.period
    print(f"per iteration, amortized: {step:.1f} us, and {handover:.1f} us of TensorBoard's hand-over")


if __name__ == "__main__":
    main()
