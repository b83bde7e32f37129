"""One plain-``Trainer`` script, run as a user runs it on one or several processes.

    python tests/dist_scripts/plain_trainer.py OUT --batch-size 16
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist_scripts/plain_trainer.py OUT --batch-size 8
    python tests/dist_scripts/plain_trainer.py OUT --launch 2 --loader dataloader --batch-size 8

Trains a small classifier for 3 epochs (shuffled, evaluated each epoch on 37
samples, which two processes share unevenly) into ``OUT``. Then each process
writes ``OUT-result/rank{R}.pt`` (its final weights) and the main process
``OUT-result/result.json`` (the history's epochs and an ``evaluate()`` after
training). ``--kill-at N``: at iteration N the main process SIGKILLs its
process group (the whole job, as ``kill -9`` of a job does).
``--kill-rank-at R:N``: in torchrun's first attempt, rank R SIGKILLs itself
at iteration N (a lost worker, which ``--max-restarts`` restarts).
"""

import argparse
import json
import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from treadle.checkpoint import unwrap_model
from treadle.engine import launch
from treadle.trainer import Trainer
from treadle.hooks import HookBase
from treadle.utils import comm


def datasets():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96 + 37, 8, generator=g)
    y = (x @ torch.randn(8, 3, generator=g)).argmax(dim=1)
    full = torch.utils.data.TensorDataset(x, y)
    return torch.utils.data.Subset(full, range(96)), torch.utils.data.Subset(full, range(96, 96 + 37))


class KillAt(HookBase):
    """After iteration ``at``: rank ``rank`` SIGKILLs the job's process group,
    or only itself (``whole_job=False``, in torchrun's first attempt only)."""

    def __init__(self, at: int, rank: int = 0, whole_job: bool = True) -> None:
        self.at, self.rank, self.whole_job = at, rank, whole_job

    def after_step(self) -> None:
        if self.trainer.iter != self.at or comm.get_rank() != self.rank:
            return
        if self.whole_job:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        elif os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)


def kill_hooks(args) -> list:
    hooks = [KillAt(args.kill_at)] if args.kill_at else []
    if args.kill_rank_at:
        rank, at = (int(x) for x in args.kill_rank_at.split(":"))
        hooks.append(KillAt(at, rank, whole_job=False))
    return hooks


class SeedStyle(Trainer):
    """The seeds' override points (--overrides): qurious' train_step, pytorch-accelerated's
    calculate_eval_batch_loss and a callback's on_train_epoch_end."""

    def train_step(self, batch):
        inputs, targets = self._prepare_batch(batch)
        self.optimizer.zero_grad()
        loss = self._compute_loss(self._forward_pass(inputs), targets)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def calculate_eval_batch_loss(self, batch):
        return super().calculate_eval_batch_loss(batch)


class EpochEnds:
    def __init__(self) -> None:
        self.seen = []

    def on_train_epoch_end(self, trainer, **kwargs):
        self.seen.append(trainer.iter)


def main(args) -> None:
    train, evaluation = datasets()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    batches = {"batch_size": args.batch_size} if args.batch_size else {"total_batch_size": args.total_batch_size}
    if args.loader == "dataloader":
        train = torch.utils.data.DataLoader(train, shuffle=True, **batches)
        batches = {}
    epoch_ends = EpochEnds()
    trainer = (SeedStyle if args.overrides else Trainer)(
        model, "sgd", train, lr=0.2, loss_fn=F.cross_entropy, eval_loader=evaluation, eval_batch_size=5,
        metrics=["accuracy", "loss"], max_epochs=3, output_dir=args.out, seed=0, checkpoint_period=4,
        log_period=2, progress_bar=False, hooks=kill_hooks(args), ddp=args.ddp,
        callbacks=[epoch_ends] if args.overrides else [], **batches,
    )
    history = trainer.train(resume=args.resume)
    results = trainer.evaluate()
    out = Path(f"{args.out}-result")
    out.mkdir(exist_ok=True)
    torch.save(unwrap_model(trainer.model).state_dict(), out / f"rank{comm.get_rank()}.pt")
    if comm.is_main_process():
        (out / "result.json").write_text(json.dumps({"epochs": history.epochs, "evaluate": results,
                                                     "epoch_ends": epoch_ends.seen}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--total-batch-size", type=int)
    parser.add_argument("--loader", choices=("dataset", "dataloader"), default="dataset")
    parser.add_argument("--launch", type=int, default=0, help="processes spawned by treadle's launch()")
    parser.add_argument("--ddp", default="ddp")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--kill-rank-at", default="")
    parser.add_argument("--overrides", action="store_true", help="train the SeedStyle subclass")
    args = parser.parse_args()
    if args.launch:
        launch(main, args.launch, args=(args,))
    else:
        main(args)
