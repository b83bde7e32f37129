"""Loaders of the UCI handwritten digits, shipped with treadle (``treadle/data/datasets/files``)."""

from treadle.config import LazyCall as L
from treadle.data import build_test_loader, build_train_loader
from treadle.data.datasets import DigitsDataset
from treadle.evaluation import build_evaluator

dataloader = dict(
    train=L(build_train_loader)(
        dataset=L(DigitsDataset)(split="train"),
        total_batch_size=64,
        num_workers=0,
        seed=None,  # None: the run's train.seed
    ),
    test=L(build_test_loader)(dataset=L(DigitsDataset)(split="test"), batch_size=256),
    evaluator=L(build_evaluator)(metrics=["accuracy", "f1", "loss"], num_classes=10),
)
