"""Data loading for treadle: resumable samplers and loaders with per-sample seeding.

See ``docs/data.md``.
"""

from .build import build_test_loader, build_train_loader
from .iterable import ShardedIterable
from .per_sample import SeededMapDataset, StreamBatchSampler
from .samplers import InferenceSampler, TrainingSampler
from .seeding import sample_seed, seed_cpu_rngs
from .stream import DataStream
from .train_loader import TrainLoader

__all__ = [
    "DataStream",
    "TrainingSampler",
    "InferenceSampler",
    "TrainLoader",
    "build_train_loader",
    "build_test_loader",
    "StreamBatchSampler",
    "SeededMapDataset",
    "ShardedIterable",
    "sample_seed",
    "seed_cpu_rngs",
]
