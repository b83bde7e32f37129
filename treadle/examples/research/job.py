"""What every research example's job shares: its flags, and the hooks that make
a run resumable (a periodic checkpoint of every model, optimizer and the
trainer; ``metrics.json`` from the main process; ``--resume`` from the last
checkpoint)."""

from __future__ import annotations

import argparse
import os
from typing import List, Optional, Sequence

from treadle.checkpoint import Checkpointer
from treadle.engine import HookBase, TrainerBase
from treadle.events import JSONWriter
from treadle.hooks import PeriodicCheckpointer, PeriodicWriter
from treadle.utils import comm

__all__ = ["parse_args", "train"]


def parse_args(description: str, argv: Optional[List[str]] = None, *, processes: bool = False) -> argparse.Namespace:
    """``--output-dir``, ``--max-iter``, ``--checkpoint-period``, ``--resume``,
    and ``--num-gpus`` for an example that runs on several processes."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-iter", type=int, default=40)
    parser.add_argument("--checkpoint-period", type=int, default=5)
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --output-dir")
    if processes:
        parser.add_argument("--num-gpus", type=int, default=1, help="processes (gloo on a CPU)")
    return parser.parse_args(argv)


def train(trainer: TrainerBase, checkpointer: Checkpointer, args: argparse.Namespace,
          hooks: Sequence[HookBase] = ()) -> None:
    """Registers ``hooks``, the periodic checkpoint and the metrics writer
    (a row per iteration), resumes where ``args.resume`` says, and trains to
    ``args.max_iter``."""
    writers = [JSONWriter(os.path.join(args.output_dir, "metrics.json"))] if comm.is_main_process() else []
    trainer.register_hooks([
        *hooks,
        PeriodicCheckpointer(checkpointer, period=args.checkpoint_period),
        PeriodicWriter(writers, period=1),
    ])
    start_iter = 0
    if args.resume:
        start_iter = int(checkpointer.resume_or_load("", resume=True).get("iteration", -1)) + 1
    trainer.train(start_iter, args.max_iter)
