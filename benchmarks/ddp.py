"""Data-parallel training on this machine: 1 process against 2 (gloo on CPU).

For each model, the same global batch (``--batch``, over all ranks) is trained

* by one process (no process group, no DDP),
* by ``launch(..., 2)``: two gloo processes, DDP, each rank half the batch,

with ``TrainerBase`` + ``EagerStep`` + ``IterationTimer``, ``LRScheduler`` and
``PeriodicWriter`` every 20 iterations (rank 0 writes ``metrics.json``), on
the digits data set through ``build_train_loader``. Reported: iterations per
second after a warm-up, samples per second, and the ratio 2 processes / 1.

Then the cost of a flush in the 2-process group: the time of
``reduce_across_ranks`` (the storage's reducer, the only communication treadle
adds to a flush) on the scalars one writer period publishes, against the
time of an iteration.

Models: the digits MLP of ``configs/digits_mlp.py`` (64-256-128-10, 50k
parameters) and a wider MLP (64-1024-1024-10, 1.1M parameters), whose
gradient all-reduce is heavier.

Run: ``python benchmarks/ddp.py`` (``--iters``, ``--batch``, ``--threads``).
By default one process uses torch's thread count (all cores) and each of
two processes half of it (what ``launch`` sets on CPU); ``--threads N`` sets
it in every process.
On GPUs use ``tools/train_net.py --num-gpus N`` and compare the ``time``
column of ``metrics.json`` instead; see ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from treadle.data import build_train_loader
from treadle.data.datasets import DigitsDataset
from treadle.engine import EagerStep, HookBase, TrainerBase
from treadle.engine.launch import create_ddp_model, launch
from treadle.events import JSONWriter
from treadle.events.distributed import reduce_across_ranks
from treadle.events.storage import ScalarKind
from treadle.hooks import IterationTimer, LRScheduler, PeriodicWriter
from treadle.models import MLPClassifier
from treadle.utils import comm

LOG_PERIOD = 20
MODELS = {"digits MLP": (256, 128), "wide MLP": (1024, 1024)}


class _Clock(HookBase):
    """Wall time from the first iteration after ``warmup`` to the end of the last."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start: Optional[float] = None
        self.end = 0.0

    def before_step(self) -> None:
        if self.trainer.iter == self.warmup:
            comm.synchronize()  # every rank starts the clock together
            self.start = time.perf_counter()

    def after_step(self) -> None:
        if self.trainer.iter == self.trainer.max_iter - 1:
            self.end = time.perf_counter()


def _train(hidden: List[int], batch: int, iters: int, warmup: int, out_dir: str) -> float:
    """Iterations per second of this process's part of the run (the slowest rank sets the pace)."""
    torch.manual_seed(0)
    model = create_ddp_model(MLPClassifier(64, 10, hidden_dims=tuple(hidden), dropout=0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=iters)
    loader = build_train_loader(DigitsDataset(split="train"), total_batch_size=batch, seed=0)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    clock = _Clock(warmup)
    writers = [JSONWriter(os.path.join(out_dir, "metrics.json"))] if comm.is_main_process() else []
    trainer.register_hooks([clock, IterationTimer(), LRScheduler(optimizer, scheduler), PeriodicWriter(writers, LOG_PERIOD)])
    trainer.train(0, iters)
    seconds = clock.end - clock.start
    # max, not mean: the slowest rank sets the pace.
    return (iters - warmup) / max(comm.all_gather(seconds))


def _flush_cost(repeats: int) -> Dict[str, float]:
    """Seconds per ``reduce_across_ranks`` call on one writer period's scalars."""
    # What EagerStep, IterationTimer and LRScheduler publish per iteration.
    names = [("total_loss", ScalarKind.LOSS), ("data_time", ScalarKind.TIME), ("time", ScalarKind.TIME), ("lr", None)]
    # The loss is a tensor, the times and the rate Python numbers, as they are put.
    entries = [
        (n, torch.tensor(float(i)) if kind == ScalarKind.LOSS else float(i), kind)
        for i in range(LOG_PERIOD)
        for n, kind in names
    ]
    # For scale: one all_gather_single of the same values (a one-collective flush).
    values = torch.tensor([float(value) for _, value, _ in entries], dtype=torch.float64)
    gathered = torch.empty(comm.get_world_size() * values.numel(), dtype=values.dtype)
    times: Dict[str, List[float]] = {"reduce": [], "one all_gather": []}
    for _ in range(repeats):
        for name, call in (
            ("reduce", lambda: reduce_across_ranks(entries)),
            ("one all_gather", lambda: dist.all_gather_single(gathered, values)),
        ):
            comm.synchronize()
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {"entries": len(entries), **{name: statistics.median(t) for name, t in times.items()}}


def _job(args: argparse.Namespace, result_file: str) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    results: Dict[str, Any] = {"world": comm.get_world_size(), "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as out_dir:
        for name, hidden in MODELS.items():
            results[name] = _train(list(hidden), args.batch, args.iters, args.warmup, out_dir)
    if comm.get_world_size() > 1:
        results["flush"] = _flush_cost(args.flush_repeats)
    if comm.is_main_process():
        with open(result_file, "w") as f:
            json.dump(results, f)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=300, help="iterations per run (default 300)")
    parser.add_argument("--warmup", type=int, default=40, help="iterations left out of the timing (default 40)")
    parser.add_argument("--batch", type=int, default=64, help="global batch size, over all ranks (default 64)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (default: torch's own)")
    parser.add_argument("--flush-repeats", type=int, default=200, help="timed reduce_across_ranks calls")
    args = parser.parse_args(argv)

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (1, 2):
            path = os.path.join(tmp, f"world{world}.json")
            launch(_job, world, args=(args, path))
            with open(path) as f:
                results[world] = json.load(f)

    one, two = results[1], results[2]
    print(f"\ngloo on CPU, {os.cpu_count()} cores; global batch {args.batch}; {args.iters - args.warmup} timed iterations; "
          f"torch threads per process: {one['threads']} (1 process), {two['threads']} (2 processes)")
    header = f"{'model':<12} {'1 process it/s':>15} {'2 processes it/s':>17} {'2/1':>6} {'samples/s (2)':>14}"
    print(header)
    print("-" * len(header))
    for name in MODELS:
        print(f"{name:<12} {one[name]:>15.1f} {two[name]:>17.1f} {two[name] / one[name]:>6.2f} {two[name] * args.batch:>14.0f}")
    flush = two["flush"]["reduce"]
    iteration = 1.0 / two["digits MLP"]
    print(
        f"\nflush: reduce_across_ranks of {two['flush']['entries']} scalars (one writer period of {LOG_PERIOD}) "
        f"takes {flush * 1e3:.3f} ms (median of {args.flush_repeats}; one bare all_gather_single of the "
        f"same values: {two['flush']['one all_gather'] * 1e3:.3f} ms);\n"
        f"a 2-process digits iteration takes {iteration * 1e3:.3f} ms: the flush costs {flush / iteration:.2f} iteration(s), "
        f"{flush / LOG_PERIOD / iteration * 100:.2f}% of training time when amortized over its period."
    )


if __name__ == "__main__":
    sys.exit(main())
