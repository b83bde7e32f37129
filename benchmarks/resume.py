"""What resuming and checkpointing cost.

1. **Resume latency by position.** A map-style dataset (100,000 samples,
   total batch 32, shuffled, two data workers). A checkpoint is built
   directly, as if written after iteration 10 and after iteration 1,000,000
   (trainer iteration and a data position of ``(iteration + 1) * 32``
   samples, i.e. epoch 320 for the second). Timed: from
   ``Checkpointer.resume_or_load`` to the first batch of the resumed loader.
   The two must be close: the sampler starts inside the right epoch's
   permutation without walking the positions before it.
2. **Save time** of a ~25M-parameter model with Adam state (~300 MB file):
   ``Checkpointer.save`` (safety check, ``torch.save`` to a temporary file,
   fsync, rename, pointer).
3. **Stall of the loop while saving.** The same model trained by
   ``TrainerBase`` with a ``PeriodicCheckpointer``: wall time between
   consecutive iterations' starts, at iterations that save versus the median.
4. **Load time, and what checking the checksums adds.** The file of 2.
   loaded by ``load_checkpoint_file`` (every record's CRC-32 checked, then
   ``torch.load(weights_only=True)``) versus ``torch.load`` alone on the same
   open file, and the check alone. The file is in the page cache (it was just
   written and is read once before timing): this is the CPU cost of the
   check, not a disk's read speed.

Run: ``python benchmarks/resume.py`` (``--repeats``, ``--iters`` to change).
Figures are medians over the repeats; the machine's load shows in them.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Dict, List

import torch
from torch import nn
from torch.utils.data import Dataset

from treadle.checkpoint import Checkpointer, load_checkpoint_file
from treadle.checkpoint.serialization import _verify_checksums
from treadle.utils.file_io import PathManager
from treadle.data import build_train_loader
from treadle.engine import EagerStep, TrainerBase
from treadle.hooks import CallbackHook, LRScheduler, PeriodicCheckpointer

DATASET_SIZE = 100_000
TOTAL_BATCH = 32


class Samples(Dataset):
    """Map-style: a sample is computed from its index (no storage to load)."""

    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index)
        return torch.randn(32, generator=g), index % 10


def small_job(out: str, num_workers: int):
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    loader = build_train_loader(Samples(), total_batch_size=TOTAL_BATCH, num_workers=num_workers, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = TrainerBase(EagerStep(model, loader, opt, loss_fn=nn.functional.cross_entropy))
    trainer.register_hooks([LRScheduler(opt, torch.optim.lr_scheduler.StepLR(opt, 1000))])
    return model, loader, opt, trainer, Checkpointer(model, out, optimizer=opt, trainer=trainer)


def write_checkpoint_at(out: str, iteration: int) -> None:
    """A checkpoint as PeriodicCheckpointer would write it after ``iteration``, built directly."""
    model, loader, opt, trainer, checkpointer = small_job(out, num_workers=0)
    state = trainer.state_dict()
    state["iteration"] = iteration
    state["step"]["data"]["position"] = (iteration + 1) * TOTAL_BATCH
    name = f"model_{iteration:07d}.pth"
    torch.save(
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "trainer": state, "iteration": iteration},
        os.path.join(out, name),
    )
    checkpointer.tag_last_checkpoint(name)


def time_resume(out: str, num_workers: int) -> Dict[str, float]:
    """Seconds from resume_or_load to the first batch; also the resumed position (a check)."""
    model, loader, opt, trainer, checkpointer = small_job(out, num_workers)
    t0 = time.perf_counter()
    extra = checkpointer.resume_or_load("", resume=True)
    t1 = time.perf_counter()
    batches = iter(loader)
    next(batches)
    t2 = time.perf_counter()
    expected = (extra["iteration"] + 2) * TOTAL_BATCH
    if loader.position != expected:
        raise RuntimeError(f"resumed at position {loader.position}, expected {expected}")
    del batches  # shuts the workers down
    return {"load": t1 - t0, "first_batch": t2 - t1, "total": t2 - t0}


def bench_resume(repeats: int) -> None:
    print(f"1. Resume: resume_or_load -> first batch (map-style, {DATASET_SIZE:,} samples, batch {TOTAL_BATCH})")
    print(f"   {'iteration':>10}  {'epoch':>6}  {'workers':>7}  {'load (ms)':>10}  {'first batch (ms)':>17}  {'total (ms)':>11}")
    totals: Dict[tuple, float] = {}
    for num_workers in (0, 2):
        for iteration in (10, 1_000_000):
            with tempfile.TemporaryDirectory() as out:
                write_checkpoint_at(out, iteration)
                runs = [time_resume(out, num_workers) for _ in range(repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            totals[(num_workers, iteration)] = med["total"]
            epoch = (iteration + 1) * TOTAL_BATCH // DATASET_SIZE
            print(
                f"   {iteration:>10,}  {epoch:>6}  {num_workers:>7}  {1000 * med['load']:>10.1f}  "
                f"{1000 * med['first_batch']:>17.1f}  {1000 * med['total']:>11.1f}"
            )
    for num_workers in (0, 2):
        delta = totals[(num_workers, 1_000_000)] - totals[(num_workers, 10)]
        print(f"   iteration 1,000,000 vs 10, {num_workers} workers: {1000 * delta:+.1f} ms")


class Big(nn.Module):
    """About 25M parameters: five 2240x2240 linear layers."""

    def __init__(self, width: int = 2240, depth: int = 5) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
        self.width = width

    def forward(self, x):
        return self.layers(x)


class Endless:
    """Random batches for the big model, forever."""

    def __init__(self, width: int, batch: int = 8) -> None:
        self.x, self.y = torch.randn(batch, width), torch.randn(batch, width)

    def __iter__(self):
        while True:
            yield self.x, self.y


def big_job(out: str):
    torch.manual_seed(0)
    model = Big()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    trainer = TrainerBase(EagerStep(model, Endless(model.width), opt, loss_fn=nn.functional.mse_loss))
    return model, opt, trainer, Checkpointer(model, out, optimizer=opt, trainer=trainer)


def bench_save(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        model, opt, trainer, checkpointer = big_job(out)
        trainer.train(0, 1)  # one Adam step: the optimizer has its two moment buffers
        params = sum(p.numel() for p in model.parameters())
        times = []
        for i in range(repeats):
            t0 = time.perf_counter()
            path = checkpointer.save(f"model_{i:07d}", iteration=i)
            times.append(time.perf_counter() - t0)
        size = os.path.getsize(path)
    med = statistics.median(times)
    print(f"2. Save: {params / 1e6:.1f}M parameters + Adam state, file {size / 2**20:.0f} MiB")
    print(
        f"   Checkpointer.save: median {med:.2f} s ({size / 2**20 / med:.0f} MiB/s), "
        f"min {min(times):.2f} s, max {max(times):.2f} s over {repeats}"
    )


def bench_stall(iters: int, period: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        model, opt, trainer, checkpointer = big_job(out)
        starts: List[float] = []
        trainer.register_hooks(
            [
                CallbackHook(before_step=lambda t: starts.append(time.perf_counter())),
                PeriodicCheckpointer(checkpointer, period=period, max_to_keep=1),
            ]
        )
        trainer.train(0, iters)
        starts.append(time.perf_counter())  # not exact for the last one (it includes model_final): dropped below
    # durations[i]: from the start of iteration i to the start of i + 1 (step + every hook).
    durations = [b - a for a, b in zip(starts, starts[1:])][:-1]
    saving = [i for i in range(len(durations)) if (i + 1) % period == 0]
    plain = [d for i, d in enumerate(durations) if i not in saving and i >= 2]  # skip warm-up
    median = statistics.median(plain)
    with_save = statistics.median(durations[i] for i in saving)
    print(f"3. Stall: {iters} iterations of the same model (batch 8), a checkpoint every {period}")
    print(f"   median iteration: {1000 * median:.0f} ms; iteration with a save: {1000 * with_save:.0f} ms "
          f"(median of {len(saving)}); stall {1000 * (with_save - median):.0f} ms per save "
          f"({with_save / median:.1f}x an iteration)")


def bench_load(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        model, opt, trainer, checkpointer = big_job(out)
        trainer.train(0, 1)
        path = checkpointer.save("model_0000000", iteration=0)
        size = os.path.getsize(path) / 2**20

        def plain() -> None:
            with PathManager.open(path, "rb") as f:
                torch.load(f, map_location="cpu", weights_only=True)

        def check_only() -> None:
            with PathManager.open(path, "rb") as f:
                if not _verify_checksums(f, path):
                    raise RuntimeError(f"{path} has no checksums")

        runs = {"torch.load alone": plain, "checksums alone": check_only, "load_checkpoint_file": lambda: load_checkpoint_file(path)}
        times: Dict[str, List[float]] = {name: [] for name in runs}
        plain()  # warm the page cache
        for _ in range(repeats):
            for name, fn in runs.items():  # interleaved: the machine's load hits each alike
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"4. Load: the file of 2. ({size:.0f} MiB), from the page cache, median of {repeats}")
    for name, t in med.items():
        print(f"   {name:<22} {1000 * t:7.0f} ms  ({size / t:5.0f} MiB/s)")
    extra = med["load_checkpoint_file"] - med["torch.load alone"]
    print(f"   checking the checksums adds {1000 * extra:.0f} ms ({extra / med['torch.load alone']:+.0%} of torch.load alone)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--period", type=int, default=10)
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the checkpointer logs every save
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f}\n")
    bench_resume(args.repeats)
    print()
    bench_save(max(args.repeats // 2, 3))
    print()
    bench_stall(args.iters, args.period)
    print()
    bench_load(args.repeats)


if __name__ == "__main__":
    main()
