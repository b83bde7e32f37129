"""A small, complete training job for the resume tests.

Run as a script (the tests start it in subprocesses and kill it)::

    python tests/resume_job.py --output-dir D --max-iter N [--checkpoint-period P]
        [--resume] [--pause-in-save-marker FILE] [--pause-on checkpoint|pointer|after-pointer]
        [--progress-file F] [--num-workers W] [--log-period L] [--defer] [--fail-at K]
        [--preempt-at K] [--async-save] [--format file|dcp]

or import it and call :func:`run` (the in-process tests do).

Everything that can make a resumed run differ from an uninterrupted one is
here on purpose: dropout (torch's global generator in the main process), a
random augmentation inside ``__getitem__`` (torch's generator in the data
workers), a shuffled map-style dataset read by two worker processes, SGD with
momentum (optimizer state) and a step learning-rate schedule (scheduler state).

Exit status: 0 when training ends (or there was nothing to train),
``PREEMPTED_EXIT_CODE`` (75) after a SIGTERM, 1 when ``--fail-at`` raised.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from treadle.checkpoint import Checkpointer
from treadle.data import build_train_loader
from treadle.engine import EagerStep, HookBase, TrainerBase
from treadle.events import JSONWriter, TensorboardWriter
from treadle.hooks import IterationTimer, LRScheduler, PeriodicCheckpointer, PeriodicWriter, PreemptionHandler
from treadle.utils.env import seed_all_rng
from treadle.utils.logger import setup_logger

__all__ = ["SEED", "ToyDataset", "MLP", "Job", "build_job", "run", "main", "FailAt", "PreemptAt", "ProgressFile"]

SEED = 1234
BATCH_SIZE = 8
DATASET_SIZE = 96  # 12 iterations per epoch: every run here crosses several epochs
MAX_TO_KEEP = 2
# How long a paused save waits before its rename: far longer than the test
# needs to see the marker and kill the process.
PAUSE_SECONDS = 5.0


class ToyDataset(Dataset):
    """Fixed inputs and labels; ``__getitem__`` adds noise from torch's global generator.

    The noise is the random augmentation: the loader's per-sample seeding
    makes it a function of the sample's stream position only.
    """

    def __init__(self, size: int = DATASET_SIZE, dim: int = 16, classes: int = 4) -> None:
        g = torch.Generator().manual_seed(7)
        self.inputs = torch.randn(size, dim, generator=g)
        self.labels = (self.inputs @ torch.randn(dim, classes, generator=g)).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int):
        x = self.inputs[index] + 0.1 * torch.randn(self.inputs.shape[1])
        return x, self.labels[index]


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ProgressFile(HookBase):
    """Appends the iteration to a file at the start of every iteration.

    One unbuffered ``write`` per line, so a reader (the test, polling) sees
    which iteration the job is in without parsing logs.
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: Optional[int] = None

    def before_train(self) -> None:
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def before_step(self) -> None:
        os.write(self._fd, f"{self.trainer.iter}\n".encode())

    def after_train(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FailAt(HookBase):
    """Raises in ``after_step`` of one iteration: a crash with an exception."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_step(self) -> None:
        if self.trainer.iter == self.iteration:
            raise RuntimeError(f"FailAt: simulated crash at iteration {self.iteration}")


class PreemptAt(HookBase):
    """Sends this process a SIGTERM in ``after_step`` of one iteration: a
    preemption, which ``PreemptionHandler`` answers at that iteration's end."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def after_step(self) -> None:
        if self.trainer.iter == self.iteration:
            os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class Job:
    model: MLP
    optimizer: torch.optim.Optimizer
    trainer: TrainerBase
    checkpointer: Checkpointer
    loader: object


def build_job(
    output_dir: str,
    *,
    checkpoint_period: int = 3,
    num_workers: int = 2,
    max_to_keep: Optional[int] = MAX_TO_KEEP,
    progress_file: Optional[str] = None,
    log_period: int = 1,
    defer: Optional[bool] = None,
    extra_hooks: Sequence[Optional[HookBase]] = (),
    async_save: bool = False,
    checkpoint_format: Optional[str] = None,
) -> Job:
    """Builds the job's objects; the caller seeds the generators first (model init draws from them).

    ``extra_hooks`` are registered after the LR scheduler, before the checkpointer.
    """
    model = MLP()
    loader = build_train_loader(
        ToyDataset(), total_batch_size=BATCH_SIZE, num_workers=num_workers, shuffle=True, seed=SEED
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    trainer = TrainerBase(EagerStep(model, loader, optimizer, loss_fn=nn.functional.cross_entropy))
    trainer.epoch_length = loader.epoch_length
    checkpointer = Checkpointer(model, output_dir, format=checkpoint_format, optimizer=optimizer, trainer=trainer)
    # window_size=1: each line holds the value of its own iteration, not a
    # median over iterations before it, so lines can be compared across runs.
    writers = [
        JSONWriter(os.path.join(output_dir, "metrics.json"), window_size=1),
        TensorboardWriter(output_dir, window_size=1),
    ]
    trainer.register_hooks(
        [
            ProgressFile(progress_file) if progress_file else None,
            IterationTimer(),
            LRScheduler(optimizer, scheduler),
            *extra_hooks,
            PeriodicCheckpointer(checkpointer, period=checkpoint_period, max_to_keep=max_to_keep, async_save=async_save),
            PreemptionHandler(checkpointer),
            PeriodicWriter(writers, period=log_period, defer=defer),
        ]
    )
    return Job(model, optimizer, trainer, checkpointer, loader)


def run(
    output_dir: str,
    max_iter: int,
    *,
    resume: bool = False,
    checkpoint_period: int = 3,
    num_workers: int = 2,
    max_to_keep: Optional[int] = MAX_TO_KEEP,
    progress_file: Optional[str] = None,
    log_period: int = 1,
    defer: Optional[bool] = None,
    fail_at: Optional[int] = None,
    preempt_at: Optional[int] = None,
    async_save: bool = False,
    checkpoint_format: Optional[str] = None,
) -> Job:
    """Seeds, builds, resumes (with ``resume``) and trains; returns the job's objects."""
    # The same thread count in every run: reductions may split differently otherwise.
    torch.set_num_threads(1)
    # Resuming replaces these states with the checkpoint's; seeding first keeps
    # a fresh start (nothing to resume from) identical to an uninterrupted run.
    seed_all_rng(SEED)
    job = build_job(
        output_dir,
        checkpoint_period=checkpoint_period,
        num_workers=num_workers,
        max_to_keep=max_to_keep,
        progress_file=progress_file,
        log_period=log_period,
        defer=defer,
        extra_hooks=[
            FailAt(fail_at) if fail_at is not None else None,
            PreemptAt(preempt_at) if preempt_at is not None else None,
        ],
        async_save=async_save,
        checkpoint_format=checkpoint_format,
    )
    start_iter = 0
    if resume:
        extra = job.checkpointer.resume_or_load("", resume=True)
        start_iter = int(extra.get("iteration", -1)) + 1
    print(f"resume_job: training from iteration {start_iter} to {max_iter}", flush=True)
    job.trainer.train(start_iter, max_iter)
    return job


def install_pause_in_save(marker: str, target: str) -> None:
    """Makes the first checkpoint save of this process stop for a while, after touching ``marker``.

    Where it stops, by ``target``:

    - ``"checkpoint"``: before ``model_NNNNNNN.pth`` replaces its temporary
      file (written and fsynced; not renamed), or before a DCP directory
      ``.model_NNNNNNN.dcp.partial`` (complete, its checksums recorded) is
      renamed to ``model_NNNNNNN.dcp``;
    - ``"pointer"``: before ``last_checkpoint`` moves (the new checkpoint is
      in place, the pointer still names the previous one);
    - ``"after-pointer"``: right after ``last_checkpoint`` moved (the save is
      complete; the hooks after the checkpointer have not run).

    A test that kills the process on seeing the marker kills it at that point.
    """
    pattern = re.compile(r"model_\d+\.(pth|dcp)" if target == "checkpoint" else r"last_checkpoint")
    real_replace, real_rename = os.replace, os.rename
    paused = []

    def pause(src, dst) -> None:
        paused.append(dst)
        with open(marker, "w") as f:
            f.write(f"{os.getpid()} {src} -> {dst}\n")
        time.sleep(PAUSE_SECONDS)

    def paused_move(real):
        def move(src, dst, *args, **kwargs):
            hit = not paused and pattern.fullmatch(os.path.basename(os.fspath(dst)))
            if hit and target != "after-pointer":
                pause(src, dst)
            real(src, dst, *args, **kwargs)
            if hit and target == "after-pointer":
                pause(src, dst)

        return move

    os.replace = paused_move(real_replace)
    os.rename = paused_move(real_rename)  # a DCP directory is published by os.rename


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-iter", type=int, required=True)
    parser.add_argument("--checkpoint-period", type=int, default=3)
    parser.add_argument("--max-to-keep", type=int, default=MAX_TO_KEEP)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--pause-in-save-marker", help="touch this file and pause in the first checkpoint rename")
    parser.add_argument("--pause-on", choices=("checkpoint", "pointer", "after-pointer"), default="checkpoint")
    parser.add_argument("--progress-file", help="append each iteration's number to this file as it starts")
    parser.add_argument("--log-period", type=int, default=1, help="PeriodicWriter period")
    parser.add_argument("--defer", action="store_true", help="PeriodicWriter(defer=True): rows a period late")
    parser.add_argument("--fail-at", type=int, help="raise an exception after this iteration")
    parser.add_argument("--preempt-at", type=int, help="send this process a SIGTERM at this iteration")
    parser.add_argument("--async-save", action="store_true", help="periodic checkpoints written in the background")
    parser.add_argument("--format", choices=("file", "dcp"), help="the Checkpointer's format")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    setup_logger()
    if args.pause_in_save_marker:
        install_pause_in_save(args.pause_in_save_marker, args.pause_on)
    run(
        args.output_dir,
        args.max_iter,
        resume=args.resume,
        checkpoint_period=args.checkpoint_period,
        num_workers=args.num_workers,
        max_to_keep=args.max_to_keep,
        progress_file=args.progress_file,
        log_period=args.log_period,
        defer=True if args.defer else None,
        fail_at=args.fail_at,
        preempt_at=args.preempt_at,
        async_save=args.async_save,
        checkpoint_format=args.format,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
