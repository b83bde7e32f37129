"""The plain ``Trainer`` on the digits shipped with treadle, as a script.

The same script trains on one process or on several::

    python -m treadle.examples.digits_trainer --batch-size 64 --output-dir output/trainer_1
    torchrun --standalone --nproc-per-node 2 -m treadle.examples.digits_trainer --batch-size 32 --output-dir output/trainer_2

``--batch-size`` is per process (two processes of 32 make the steps of one
process of 64, and end with its weights to float tolerance);
``--total-batch-size`` is over all processes instead. ``--resume`` continues
the run of ``--output-dir`` from its last checkpoint, on any number of
processes with the same total batch.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import torch

from treadle.data.datasets import DigitsDataset
from treadle.trainer import Trainer
from treadle.models import MLPClassifier
from treadle.utils import comm


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    batch = parser.add_mutually_exclusive_group(required=True)
    batch.add_argument("--batch-size", type=int, help="samples per process and step")
    batch.add_argument("--total-batch-size", type=int, help="samples per step over all processes")
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--resume", action="store_true", help="continue the run of --output-dir")
    args = parser.parse_args(argv)

    train_dataset, val_dataset = DigitsDataset("train"), DigitsDataset("test")
    torch.manual_seed(0)  # the model's initial weights (the processes' copies start from rank 0's anyway)
    model = MLPClassifier(train_dataset.input_dim, train_dataset.num_classes, dropout=0.0)
    trainer = Trainer(
        model, "adamw", train_dataset, batch_size=args.batch_size, total_batch_size=args.total_batch_size,
        lr=1e-2, loss_fn=torch.nn.functional.cross_entropy, eval_loader=val_dataset, eval_batch_size=256,
        metrics=["accuracy", "f1"], max_epochs=args.max_epochs, scheduler="cosine", warmup_iters=20, seed=0,
        output_dir=args.output_dir,
    )
    history = trainer.train(resume=args.resume)
    if comm.is_main_process():
        print(f"accuracy after {len(history.epochs)} epochs: {history.epochs[-1]['accuracy']:.4f}")


if __name__ == "__main__":
    main()
